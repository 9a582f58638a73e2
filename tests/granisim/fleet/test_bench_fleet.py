"""granisim bench sim --fleet: the scaling series, its router, bad arguments."""

from granisim.experiments import bench_sim


def test_a_fleet_case_runs_the_fleet_behind_the_router(monkeypatch):
    monkeypatch.setitem(bench_sim.CASES, "tiny_fleet", bench_sim.Case(
        "azure_replay.toml", (("workload.num_requests", 12), ("workload.time_scale", 2.0)),
        copies=2, replicas=2))
    seen = []
    import granisim.fleet.build as build

    orig = build.simulate_fleet

    def spy(scenario, *a, **kw):
        seen.append((scenario.fleet.replicas, scenario.fleet.router))
        return orig(scenario, *a, **kw)

    monkeypatch.setattr(build, "simulate_fleet", spy)
    got = bench_sim.measure("tiny_fleet", "granikv", "cache_aware")
    assert seen == [(2, "cache_aware")]
    assert got["router"] == "cache_aware" and got["requests"] == 12 and got["plans"] > 0


def test_the_fleet_series_and_a_bad_router(capsys, monkeypatch):
    assert bench_sim.FLEET_CASES == ("fleet_1", "fleet_4", "fleet_16", "fleet_64")
    assert all(bench_sim.CASES[c].replicas == int(c.split("_")[1]) for c in bench_sim.FLEET_CASES)
    ran = []
    monkeypatch.setattr(bench_sim, "run", lambda out, cases, repeats, policy, router: ran.append((cases, router)))
    assert bench_sim.main(["--fleet", "--router", "cache_aware"]) == 0
    assert ran == [(list(bench_sim.FLEET_CASES), "cache_aware")]
    assert bench_sim.main(["--router", "hot_aware"]) == 2
    err = capsys.readouterr().err
    assert "unknown router 'hot_aware'" in err and err.count("\n") == 1


def test_a_fleet_simulates_the_setups_trace_not_a_fresh_one():
    """The benchmark repeats the trace in the Setup; the fleet once re-read the scenario's own trace (all
    19,366 rows here) and ignored it."""
    import dataclasses

    from granisim.config.scenario import parse_scenario
    from granisim.experiments.run import prepare, simulate

    data = bench_sim.load_case_scenario("azure_replay.toml").model_dump()
    data["fleet"] = {"replicas": 2}
    setup = prepare(parse_scenario(data))
    setup = dataclasses.replace(setup, trace=bench_sim.repeat_trace(setup.trace.iloc[:15].copy(), 2))
    assert len(simulate(setup, progress=False).records) == 30
