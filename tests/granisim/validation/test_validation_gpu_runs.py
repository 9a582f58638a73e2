"""`granisim validation gpu-run validate`: every policy and model, unit names, resuming, --no-idle, --log-gpu
(the GPU executor and the validation itself replaced by fakes: no GPU, no torch needed)."""
import json
import sys
import types

import pytest

import granisim.validation.gpu_runs as G


@pytest.fixture
def fake_engine(monkeypatch):
    calls = []
    fake = types.ModuleType("gpu_backend.executor")

    class Ex:
        def stats(self):
            return {"graph_max_rows": 2048}

    fake.for_setup = lambda setup, device, **kw: Ex()
    monkeypatch.setitem(sys.modules, "gpu_backend.executor", fake)
    monkeypatch.setattr(G, "_free_gpu", lambda: None)
    probes = iter(range(1000))  # a host probe a unit, each its own figure
    monkeypatch.setattr(G, "host_probe", lambda: {"us_per_plan": float(next(probes))})

    def validate(setup, ex, out, progress=False, idle=True):
        calls.append((out.name, setup.scenario.policy.name, setup.scenario.model.name,
                      setup.scenario.workload.num_requests, idle))
        return {"step_errors": {"total": {"median": 0.01}}, "idle": idle}

    import granisim.validation.validate as V
    monkeypatch.setattr(V, "validate", validate)
    return calls


def test_every_policy_and_model_and_resume(tmp_path, fake_engine):
    """Units run model by model, each workload under every policy, named workload_policy_model; a second call
    skips the units already written. Planted bug: the unit name without the model (``unit_name(name, pol,
    "")``) makes the second model's units look done and fails the count."""
    out = tmp_path / "out"
    G.main(["validate", "--out", str(out), "--only", "control_short", "azure_replay", "--requests", "5",
            "--models", "llama-3.1-8b,qwen-2.5-14b"])
    want = [(G.unit_name(w, p, m), p, m) for m in G.MODELS for w in ("control_short", "azure_replay")
            for p in G.POLICIES]
    assert [c[:3] for c in fake_engine] == want
    assert all(c[3] == 5 and c[4] is True for c in fake_engine)
    rep = json.loads((out / f"validation_{want[0][0]}.json").read_text())
    assert rep["workload"] == "control_short" and rep["held_out"] is False and rep["executor"]["graph_max_rows"]
    reps = [json.loads((out / f"validation_{u}.json").read_text()) for u, *_ in want]
    probed = [(r["host_probe"]["us_per_plan"], r["host_probe_after"]["us_per_plan"]) for r in reps]
    assert probed == [(2.0 * i, 2.0 * i + 1) for i in range(len(want))]  # before and after every unit
    fake_engine.clear()
    G.main(["validate", "--out", str(out), "--only", "control_short", "azure_replay", "--requests", "5",
            "--models", "llama-3.1-8b", "qwen-2.5-14b"])  # the same models, space-separated
    assert fake_engine == []  # resumed: nothing left to run


def test_no_idle_and_policies(tmp_path, fake_engine):
    G.main(["validate", "--out", str(tmp_path), "--only", "arxiv_replay_500", "--requests", "3", "--no-idle",
            "--policies", "token", "--models", "llama-3.1-8b"])
    assert fake_engine == [(G.unit_name("arxiv_replay_500", "token", "llama-3.1-8b") + "_noidle", "token",
                            "llama-3.1-8b", 3, False)]
    rep = json.loads((tmp_path / f"validation_{fake_engine[0][0]}.json").read_text())
    assert rep["held_out"] is True


def test_unknown_model_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        G.main(["validate", "--out", str(tmp_path), "--models", "llama-3.1-8b,gpt-9"])
    assert err.value.code == 2
    assert "unknown model 'gpt-9'" in capsys.readouterr().err


def test_tp_units_run_the_replica(tmp_path, fake_engine, monkeypatch):
    """--tp 2: each unit is validated by the tensor-parallel replica (its ranks write validation.json), the
    scenario has hardware.tp = 2 and the unit's name ends in _tp2. Planted: ignoring --tp (the one-process
    executor) leaves the fake replica uncalled."""
    fake_tp = types.ModuleType("gpu_backend.executor.tp")
    seen = []

    def validate_replica(setup, out, device, source, progress=False, idle=True):
        seen.append((source, setup.scenario.hardware.tp))
        out.mkdir(parents=True)
        (out / "validation.json").write_text(json.dumps({"step_errors": {"total": {"median": 0.02}},
                                                         "executor": {"tp": 2}}))

    fake_tp.validate_replica = validate_replica
    monkeypatch.setitem(sys.modules, "gpu_backend.executor.tp", fake_tp)
    out = tmp_path / "out"
    G.main(["validate", "--out", str(out), "--only", "control_short", "--policies", "granikv", "--tp", "2",
            "--models", "llama-3.1-8b",
            "--budget-s", "1000"])
    assert seen == [("control_short_granikv_llama-3.1-8b_tp2", 2)] and not fake_engine
    rep = json.loads((out / "validation_control_short_granikv_llama-3.1-8b_tp2.json").read_text())
    assert rep["executor"] == {"tp": 2} and rep["workload"] == "control_short"


def test_the_papers_setting_is_past_granikvs_capacity_with_sharegpt_like_outputs():
    """Each PAPER_RATES rate is past granikv's simulated throughput at saturation on h200: fixed at 1.5x it (the
    issue's "1.5x the simulated capacity") with the kernels of 2026-11-29, kept so that runs compare across
    kernel changes; with today's faster prefill 1.2x (16K) and 1.4x (4K). The outputs average about 250 tokens
    (ShareGPT's mean)."""
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate

    for lp, rate in G.PAPER_RATES.items():
        sc = G.paper_scenario("granikv", lp, "h200")
        res = simulate(prepare(sc.with_changes(**{"workload.rate": 1000.0})), progress=False)
        cap = summarize(requests_frame(res.records), res.steps.frame(), res.end_s)["throughput_rps"]
        assert 1.1 < rate / cap < 1.55, lp
        res = simulate(prepare(sc), progress=False)
        assert requests_frame(res.records).output_len.mean() == pytest.approx(250, abs=5)
        assert sc.workload.num_requests == 200 and sc.workload.roles == 4 and sc.workload.prefix_len == lp


def test_paper_units_alternate_policies_within_each_repetition_and_resume(tmp_path, fake_engine, monkeypatch):
    """Units paper_lp{L}_{policy}_rep{r}: every policy of a repetition before the next repetition; a second call
    skips what is written; a prefix length outside PAPER_RATES is one ValueError. Planted bug caught: the loops
    nested policy-outermost (all repetitions of granikv first)."""
    import granisim.experiments.run as R

    run = []
    real = R.simulate
    monkeypatch.setattr(R, "simulate", lambda setup, ex=None, progress=False:
                        run.append(setup.scenario.policy.name) or real(setup, progress=False))
    monkeypatch.setattr(G, "_warm_up", lambda profile, graphs: None)
    G.main(["paper", "--out", str(tmp_path), "--only", "4096", "--reps", "2", "--requests", "6",
            "--policies", "granikv", "token"])
    assert run == ["granikv", "token", "granikv", "token"]
    names = sorted(p.stem for p in tmp_path.glob("paper_*.json"))
    assert names == [f"paper_lp4096_{p}_rep{r}" for p in ("granikv", "token") for r in (0, 1)]
    unit = json.loads((tmp_path / "paper_lp4096_token_rep1.json").read_text())
    assert unit["policy"] == "token" and unit["rep"] == 1 and unit["rate"] == G.PAPER_RATES[4096]
    assert unit["throughput_rps"] > 0 and "mean_batch" in unit and "us_per_plan" in unit["host_probe"]
    run.clear()
    G.main(["paper", "--out", str(tmp_path), "--only", "4096", "--reps", "2", "--requests", "6",
            "--policies", "granikv", "token"])
    assert run == []
    with pytest.raises(ValueError, match="--only 1000: the paper's setting is defined at L_p = 4096, 16384"):
        G.main(["paper", "--out", str(tmp_path), "--only", "1000"])


def test_speedup_units_are_named_by_point_policy_and_repetition_and_resume(tmp_path, monkeypatch):
    """speedup_lp{L}_k{k}_{policy}[_rep{r}]: repetition 0 has no suffix; a second call runs nothing; with a budget of
    0 no unit starts. The engine is the cost model here (its executor stats faked)."""
    from granisim.experiments.run import prepare, simulate

    ran = []

    class Ex:
        def stats(self):
            return {"graph_max_rows": 2048}

    def burst(pol, lp, k, requests, profile, graphs, hold_gc=True):
        ran.append((pol, lp, k))
        return Ex(), simulate(prepare(G.burst_scenario(pol, lp, k, requests, profile)), progress=False)

    monkeypatch.setattr(G, "_burst", burst)
    monkeypatch.setattr(G, "_warm_up", lambda profile, graphs: None)
    args = ["speedup", "--out", str(tmp_path), "--only", "1024,4", "--requests", "4", "--policies", "granikv", "token",
            "--reps", "2"]
    G.main(args)
    assert ran == [("granikv", 1024, 4), ("token", 1024, 4)] * 2
    assert sorted(p.name for p in tmp_path.glob("speedup_*.json")) == [
        "speedup_lp1024_k4_granikv.json", "speedup_lp1024_k4_granikv_rep1.json",
        "speedup_lp1024_k4_token.json", "speedup_lp1024_k4_token_rep1.json"]
    ran.clear()
    G.main(args)
    assert ran == []
    G.main(["speedup", "--out", str(tmp_path / "b"), "--only", "1024,4", "--requests", "4", "--budget-s", "0"])
    assert ran == [] and not list((tmp_path / "b").glob("speedup_*.json"))
