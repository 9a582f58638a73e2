"""granisim run --sensitivity: every step's predicted time scaled, and how far each metric moves."""
import json

import pytest

from granisim.cli import main
from granisim.core.contract import with_steps
from granisim.costmodel.executor import CostExecutor, for_setup
from granisim.costmodel.scaled import ScaledExecutor
from granisim.experiments import sensitivity as sens
from granisim.experiments.run import prepare, simulate
from granisim.core.metrics import requests_frame, summarize
from tests.granisim.simhelpers import small


def _summary(setup, executor):
    res = simulate(setup, executor, progress=False)
    return summarize(requests_frame(res.records), res.steps.frame(), res.end_s)


def test_a_burst_served_with_every_step_slower_is_the_same_schedule_stretched():
    """All requests at once (within 40 us at 1e6/s): nothing arrives mid-run, so the schedule is the same and
    every time scales (to the arrivals' spread). hardware.step_time_scale is the scenario's way to ask for it."""
    burst = small(**{"workload.rate": 1e6})
    base = _summary(prepare(burst), None)
    slow = _summary(prepare(burst.with_changes(**{"hardware.step_time_scale": 1.25})), None)
    assert slow["steps"] == base["steps"] and slow["completed"] == base["completed"]
    assert slow["throughput_rps"] == pytest.approx(base["throughput_rps"] / 1.25, rel=1e-4)
    for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        assert slow[k] == pytest.approx(base[k] * 1.25, rel=1e-4), k


def test_the_default_scale_is_the_plain_cost_executor_and_leaves_dumps_alone():
    setup = prepare(small())
    assert type(for_setup(setup)) is CostExecutor
    assert "step_time_scale" not in small().model_dump()["hardware"]  # sweep point ids of old sweeps unchanged
    scaled = prepare(small(**{"hardware.step_time_scale": 1.1}))
    assert isinstance(for_setup(scaled), ScaledExecutor) and for_setup(scaled).factor == 1.1


def test_a_fast_forward_block_scales_its_steps_and_parts():
    setup = prepare(small())
    inner = CostExecutor(setup.profile, setup.model)
    from granisim.core.serving_loop import ServingLoop

    loop = ServingLoop(setup, inner, progress=False)
    seen = []
    real = inner.execute

    def spy(plan):  # the first fast-forwarded plan of a real run
        r = real(plan)
        if plan.num_steps > 1 and not seen:
            seen.append(plan)
        return r

    inner.execute = spy
    loop.run()
    plan = seen[0]
    a = CostExecutor(setup.profile, setup.model).execute(plan)
    b = ScaledExecutor(CostExecutor(setup.profile, setup.model), 2.0).execute(with_steps(plan, plan.num_steps))
    assert b.duration_s == pytest.approx(2 * a.duration_s)
    assert b.step_durations == pytest.approx(tuple(2 * d for d in a.step_durations))
    assert b.breakdown == pytest.approx({k: 2 * v for k, v in a.breakdown.items()})
    with pytest.raises(ValueError, match="factor 0"):
        ScaledExecutor(inner, 0)


def test_rows_give_each_metric_at_both_factors():
    base = {"throughput_rps": 4.0, "tpot_p99_s": 0.5, "preemptions": 0}
    rows = {r["metric"]: r for r in sens.rows(base, {0.97: {**base, "throughput_rps": 4.1, "tpot_p99_s": 0.4},
                                                     1.03: {**base, "throughput_rps": 3.9, "tpot_p99_s": 0.7}})}
    assert rows["tpot_p99_s"]["at"]["1.03"]["change"] == pytest.approx(0.4)
    assert rows["throughput_rps"]["at"]["0.97"]["change"] == pytest.approx(0.025)
    assert rows["preemptions"]["at"]["1.03"]["change"] is None  # no change of a zero
    assert "TPOT p99" in sens.format_table(list(rows.values()), 0.03)


def test_run_sensitivity_writes_its_table(tmp_path, capsys):
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[workload]\nkind = "multi_agent"\nroles = 2\nprefix_len = 1024\nnum_requests = 30\n'
                 'rate = 1000.0\nmax_output_len = 32\n')
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--sensitivity", "0.1"]) == 0
    doc = json.loads((tmp_path / "o" / "sensitivity.json").read_text())
    row = {r["metric"]: r for r in doc["rows"]}["throughput_rps"]
    assert doc["delta"] == 0.1 and set(row["at"]) == {"0.9", "1.1"}
    assert row["at"]["1.1"]["value"] < row["predicted"] < row["at"]["0.9"]["value"]
    assert "same_replica_share" not in {r["metric"] for r in doc["rows"]}  # one GPU: no replicas to stay on
    assert "sensitivity: every step's time" in capsys.readouterr().out


@pytest.mark.parametrize("router", ["round_robin", "least_load"])
def test_fleet_sensitivity_counts_the_requests_that_stay_on_their_replica(router, tmp_path):
    """A fleet's table has one more row: the share of requests each scaled run sends to the replica the prediction
    chose. round_robin routes by arrival order alone (all stay); least_load routes by live load, which slower or
    faster steps change (many move). Planted bug (tried, seen failing, removed): `same_replica_share` comparing
    against request ids shifted by one gave round_robin 0.0."""
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[workload]\nkind = "multi_agent"\nroles = 4\nprefix_len = 1024\nnum_requests = 60\n'
                 f'rate = 40.0\nmax_output_len = 32\n[fleet]\nreplicas = 3\nrouter = "{router}"\n')
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--sensitivity", "0.1"]) == 0
    doc = json.loads((tmp_path / "o" / "sensitivity.json").read_text())
    row = {r["metric"]: r for r in doc["rows"]}["same_replica_share"]
    shares = [a["value"] for a in row["at"].values()]
    assert row["predicted"] == 1.0 and len(shares) == 2
    if router == "round_robin":
        assert shares == [1.0, 1.0]
    else:
        assert all(0.0 < x < 0.9 for x in shares), shares


@pytest.mark.parametrize("argv,needle", [
    (["--sensitivity", "0.7"], "--sensitivity"),
    (["--sensitivity", "0"], "--sensitivity"),
])
def test_bad_sensitivity_is_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "scenarios/multi_agent_16k.toml", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and needle in err[0]


def test_a_scaled_scenario_is_refused_where_steps_are_measured(tmp_path, capsys):
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[hardware]\nstep_time_scale = 1.05\n')
    for argv in (["run", str(p), "--executor", "gpu", "--out", str(tmp_path / "o")],
                 ["validate", str(p), "--out", str(tmp_path / "v")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(p) in err[0] and "hardware.step_time_scale = 1.05" in err[0], err
    assert not (tmp_path / "o").exists() and not (tmp_path / "v").exists()


@pytest.mark.parametrize("command", [["run"], ["capacity", "--slo", "ttft_p99=5s"],
                                     ["capacity", "--slo", "ttft_p99=5s", "--rate", "5"]])
def test_a_scale_that_sensitivity_would_push_past_its_limit_is_refused_first(command, tmp_path, capsys):
    """catches: `run` printed and wrote the base results, then failed naming `<override>` and a field value the user
    never wrote (10.3), with no sensitivity.json."""
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[hardware]\nstep_time_scale = 10\n[workload]\nprefix_len = 100\nnum_requests = 10\n')
    assert main([command[0], str(p), *command[1:], "--out", str(tmp_path / "o"), "--sensitivity"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(p) in err[0] and "hardware.step_time_scale = 10" in err[0], err
    assert "--sensitivity 0.03" in err[0] and "10.3" in err[0]
    assert not (tmp_path / "o").exists()


def test_capacity_sensitivity_rows_pair_each_policy_with_its_scaled_searches():
    from granisim.experiments.capacity import CapacityResult, sensitivity_rows, sensitivity_table

    def res(pol, rate):
        return CapacityResult(policy=pol, rate=rate, upper=rate * 1.02, probes=[])

    rows = sensitivity_rows([res("granikv", 4.0), res("token", 2.0)],
                            {0.97: [res("granikv", 4.4), res("token", 2.1)], 1.03: [res("granikv", 3.6), res("token", 0.0)]})
    assert [r["policy"] for r in rows] == ["granikv", "token"]
    assert rows[0]["at"]["0.97"]["change"] == pytest.approx(0.1) and rows[1]["at"]["1.03"]["change"] == -1.0
    assert "granikv" in sensitivity_table(rows, 0.03)


def test_capacity_sensitivity_searches_again_at_both_factors(tmp_path, capsys):
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[workload]\nkind = "multi_agent"\nroles = 2\nprefix_len = 1024\nnum_requests = 40\n'
                 'rate = 8.0\nmax_output_len = 32\n')
    assert main(["capacity", str(p), "--slo", "ttft_p99=0.5s", "--policies", "granikv", "--out", str(tmp_path / "c"),
                 "--max-probes", "8", "--sensitivity", "0.2"]) == 0
    doc = json.loads((tmp_path / "c" / "capacity_sensitivity.json").read_text())
    (row,) = doc["rows"]
    assert row["at"]["1.2"]["max_rate"] < row["max_rate"] < row["at"]["0.8"]["max_rate"]
    assert (tmp_path / "c" / "steps_x0.8" / "capacity.json").exists()


def test_fleet_size_sensitivity_rows_pair_each_router_with_its_scaled_searches():
    from granisim.fleet.capacity import FleetCapacity, fleet_sensitivity_rows, fleet_sensitivity_table

    def res(router, n):
        return FleetCapacity(router=router, policy="granikv", replicas=n, gpus=n)

    rows = fleet_sensitivity_rows([res("round_robin", None), res("hot_aware", 7)],
                                  {1.03: [res("round_robin", None), res("hot_aware", 8)],
                                   0.97: [res("round_robin", 16), res("hot_aware", 7)]})
    assert rows[1] == {"router": "hot_aware", "policy": "granikv", "replicas": 7, "at": {"0.97": 7, "1.03": 8}}
    table = fleet_sensitivity_table(rows, 0.03, 16).splitlines()
    assert table[-2].split() == ["round_robin", "granikv", ">16", "16", ">16"]  # None: more than the search's most
    assert table[-1].split() == ["hot_aware", "granikv", "7", "7", "8"]


def test_fleet_size_sensitivity_searches_again_at_both_factors(tmp_path, capsys):
    """capacity --rate --sensitivity: the fewest replicas with every step 20% faster and slower, from searches of
    their own; a burst of 60 requests that one replica serves in about 6 s needs more replicas as steps slow."""
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[workload]\nkind = "multi_agent"\nroles = 4\nprefix_len = 1024\nnum_requests = 60\n'
                 'rate = 10.0\nmax_output_len = 32\n[fleet]\nreplicas = 1\nrouter = "round_robin"\n')
    assert main(["capacity", str(p), "--slo", "ttft_p99=1s", "--rate", "60", "--max-replicas", "8", "--policies",
                 "granikv", "--out", str(tmp_path / "c"), "--sensitivity", "0.2"]) == 0
    doc = json.loads((tmp_path / "c" / "fleet_capacity_sensitivity.json").read_text())
    (row,) = doc["rows"]
    assert doc["delta"] == 0.2 and row["router"] == "round_robin" and row["policy"] == "granikv"
    assert row["at"]["0.8"] < row["replicas"] < row["at"]["1.2"]
    for f in ("0.8", "1.2"):
        found = json.loads((tmp_path / "c" / f"steps_x{f}" / "fleet_capacity.json").read_text())
        assert found["results"][0]["replicas"] == row["at"][f]
    assert "fewest replicas, every step's time" in capsys.readouterr().out
