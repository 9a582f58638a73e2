"""scripts/validation_report.py: the simulator re-runs the scenario the real engine measured."""
import sys
from pathlib import Path

import pandas as pd
import pytest


import granisim.validation.report as V


def _measured(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    pd.DataFrame({"rid": range(n)}).to_parquet(folder / "measured_requests.parquet")
    return folder


def test_the_request_count_is_the_runs_own(tmp_path):
    d = _measured(tmp_path / "control_short", 96)
    assert V.run_requests(d, "control_short") == 96
    assert V.run_requests(d, "control_short", 96) == 96
    assert V.run_requests(d, "control_short", 500) == 96  # a cap above the workload's size (96) asks for 96


def test_a_requests_option_that_disagrees_with_the_run_is_an_error(tmp_path):
    d = _measured(tmp_path / "control_short", 96)
    with pytest.raises(ValueError, match=r"measured_requests.parquet: the run measured 96 requests, --requests 64"):
        V.run_requests(d, "control_short", 64)
    with pytest.raises(ValueError, match="missing, and no --requests given"):
        V.run_requests(tmp_path / "azure_replay", "azure_replay")
    assert V.run_requests(tmp_path / "azure_replay", "azure_replay", 12) == 12  # no record: the option stands


def _run_stats(run: Path, stats: dict, tokens: list[int]) -> dict:
    import json

    run.mkdir(parents=True, exist_ok=True)
    (run / "validation_control_short.json").write_text(json.dumps({"executor": stats}))
    return {"control_short": pd.DataFrame({"tokens": tokens})}


def test_the_graph_limit_is_the_runs_own(tmp_path):
    """Steps over the run's CUDA-graph limit are fitted as eager steps: the limit comes from the run, stated or
    (runs from before it was stated) the known limit that leaves exactly the run's eager steps."""
    tokens = [1, 600, 1000, 3000, 8192]
    steps = _run_stats(tmp_path / "a", {"graph_max_rows": 2048, "eager_steps": 2}, tokens)
    assert V.graph_limit(tmp_path / "a", ["control_short"], steps) == 2048
    steps = _run_stats(tmp_path / "b", {"eager_steps": 4}, tokens)
    assert V.graph_limit(tmp_path / "b", ["control_short"], steps) == 512
    steps = _run_stats(tmp_path / "c", {"eager_steps": 2}, tokens)
    assert V.graph_limit(tmp_path / "c", ["control_short"], steps) == 2048
    steps = _run_stats(tmp_path / "d", {"eager_steps": 3}, tokens)
    with pytest.raises(ValueError, match=r"validation_control_short.json: executor.graph_max_rows missing"):
        V.graph_limit(tmp_path / "d", ["control_short"], steps)


def _stubbed_report(tmp_path, monkeypatch, workloads=None):
    """`granisim validation report` on token units of ``workloads`` (default: every validation workload) plus the
    held-out one, with the engine, the simulator and the fit stubbed -> (the unit sets each fit got, h200.json,
    h200_tables.md)."""
    import json
    from types import SimpleNamespace

    from granisim.validation.gpu_runs import HELD_OUT, VALIDATION, unit_name

    names = list(VALIDATION) if workloads is None else [*workloads, HELD_OUT[0]]
    units = [unit_name(w, "token", "llama-3.1-8b") for w in names]
    frames = {u: pd.DataFrame({"unit": [u], "measured_s": [1.0], "predicted_s": [1.0]}) for u in units}
    run = tmp_path / "run"
    run.mkdir()
    e2e = {k: {"measured": 1.0, "predicted": 1.0, "error": 0.0}
           for k in ("throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")}
    for u in units:
        (run / f"validation_{u}.json").write_text(json.dumps({"date": "d", "device": "x", "idle": True,
                                                              "step_errors": {"total": {"median": 0.0, "p90": 0.0}},
                                                              "end_to_end": e2e}))
    fitted_on = []
    monkeypatch.setattr(V, "_load", lambda r, p, m: (list(units), dict(frames), {u: [] for u in units}))
    monkeypatch.setattr(V, "graph_limit", lambda *a: 2048)
    monkeypatch.setattr(V, "run_requests", lambda *a: 10)
    monkeypatch.setattr(V, "_setup", lambda *a: SimpleNamespace(profile=None, model=None))
    monkeypatch.setattr(V, "reprice", lambda steps, *a: steps)
    monkeypatch.setattr(V, "fit", lambda fs, limit, layers: fitted_on.append({f.unit.iloc[0] for f in fs}) or {})
    monkeypatch.setattr(V, "with_engine", lambda p, *a: p)
    monkeypatch.setattr(V, "_e2e", lambda *a: {"end_to_end": e2e})
    monkeypatch.setattr(V, "step_errors", lambda s: {"total": {"median": 0.0, "p90": 0.0}})
    monkeypatch.setattr(V, "_plot", lambda *a: None)
    monkeypatch.setattr(V, "replace", lambda obj, **kw: obj)
    V.main([str(run), "--out", str(tmp_path / "out"), "--policy", "token"])
    out = tmp_path / "out"
    return fitted_on, json.loads((out / "h200.json").read_text()), (out / "h200_tables.md").read_text()


def test_the_held_out_workload_joins_no_fit(tmp_path, monkeypatch):
    """Every fit the report makes (each workload's leave-one-out, in sample, and the pooled --profile-out fit)
    is on units outside HELD_OUT; the held-out unit is still judged, flagged and listed under held_out. The
    engine, the simulator and the fit are stubbed: only which units reach the fit is checked. Planted bug: the
    leave-one-out set taken from ``names`` instead of ``fitted`` fails."""
    from granisim.validation.gpu_runs import HELD_OUT, unit_name

    fitted_on, rep, _ = _stubbed_report(tmp_path, monkeypatch)
    units = list(rep["workloads"])
    held = unit_name(HELD_OUT[0], "token", "llama-3.1-8b")
    assert len(fitted_on) == 1 + 2 * len(units)
    assert all(held not in s and s for s in fitted_on)
    assert rep["held_out"] == [held] and rep["workloads"][held]["held_out"] is True
    assert set(rep["workloads"][held]["engine_calibrated_held_out"]["fitted_on"]) == set(units) - {held}

def test_a_run_with_one_fitted_workload_reports_without_a_held_out_fit(tmp_path, monkeypatch):
    """A run of one fitted workload and the held-out one (a call cut short by its budget): the fitted workload
    cannot be held out of a fit of the others, so that variant is left empty (None, "none" in the table) instead
    of a fit on no steps, and everything else is reported. Planted bug: fitting on the empty set fails here."""
    fitted_on, rep, tables = _stubbed_report(tmp_path, monkeypatch, ["arxiv_replay_150"])
    assert fitted_on and all(fitted_on)
    only = [u for u in rep["workloads"] if not rep["workloads"][u]["held_out"]]
    assert len(only) == 1 and rep["workloads"][only[0]]["engine_calibrated_held_out"] is None
    assert rep["workloads"][only[0]]["engine_calibrated_in_sample"]["fitted_on"] == only
    assert "no other workload of the run to fit on" in tables
