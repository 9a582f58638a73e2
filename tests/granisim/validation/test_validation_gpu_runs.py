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
