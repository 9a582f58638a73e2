"""scripts/validation_runs.py: the run-to-run table of measured end-to-end metrics beside the simulator's
prediction, and the simulator's sensitivity to every step being slower or faster."""
import json
import sys
from pathlib import Path

import pytest


import granisim.validation.runs as V
from granisim.config.hardware import get_profile
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest


def test_scaled_executor_scales_every_step_and_part():
    """x1.01 on a fast-forwarded decode plan: its total, each of its steps and each breakdown key."""
    prof, model = get_profile("h200"), get_model("llama-3.1-8b")
    plan = BatchPlan(0, "token", 1, tuple(PlannedRequest(i, 900 + i, 1, False) for i in range(4)), num_steps=5)
    base, scaled = V._Scaled(prof, model, 1.0).execute(plan), V._Scaled(prof, model, 1.01).execute(plan)
    assert scaled.duration_s == pytest.approx(1.01 * base.duration_s)
    assert scaled.step_durations == pytest.approx([1.01 * d for d in base.step_durations])
    assert scaled.breakdown == pytest.approx({k: 1.01 * v for k, v in base.breakdown.items()})


def _run(root: Path, name: str, tpot: float) -> None:
    metrics = {"throughput_rps": 2.0, "ttft_p99_s": 0.1, "tpot_p50_s": tpot, "tpot_p99_s": 2 * tpot}
    (root / name).mkdir(parents=True)
    (root / name / "validation_azure_replay.json").write_text(json.dumps(
        {"end_to_end": {k: {"measured": v} for k, v in metrics.items()}}))


def test_table_sets_the_runs_spread_beside_the_prediction(tmp_path, monkeypatch):
    for name, tpot in (("runA", 0.006), ("runB", 0.007), ("runC", 0.0061)):
        _run(tmp_path / "runs", name, tpot)
    out = tmp_path / "table"
    monkeypatch.setattr(sys, "argv", ["validation_runs.py", str(tmp_path / "runs"), "--out", str(out),
                                      "--requests", "12"])
    V.main()
    s = json.loads(out.with_suffix(".json").read_text())["summary"]["azure_replay"]
    t = s["tpot_p50_s"]
    assert (t["runs"], t["min"], t["median"], t["max"]) == (3, 0.006, 0.0061, 0.007)
    assert t["error_vs_median"] == pytest.approx(t["predicted"] / 0.0061 - 1)
    assert set(s["steps_x1.01"]) == set(V.METRICS) and s["steps_x1.01"]["tpot_p50_s"] != 0.0
    assert "every step x0.99" in out.with_suffix(".md").read_text()


def test_runs_option_keeps_only_the_named_run_folders(tmp_path):
    for name, tpot in (("run9", 0.006), ("run10", 0.007), ("run10b", 0.0061), ("run10/old", 0.008)):
        _run(tmp_path, name, tpot)
    assert set(V._runs(tmp_path, ["run10"])) == {"run10", "run10/old"}  # not run10b
    assert set(V._runs(tmp_path, ["run9"])) == {"run9"}
    assert set(V._runs(tmp_path)) == {"run9", "run10", "run10b", "run10/old"}


def test_runs_of_different_sizes_are_not_set_beside_one_prediction(tmp_path, monkeypatch):
    import pandas as pd

    for name, n in (("runA", 64), ("runB", 96)):
        _run(tmp_path, name, 0.006)
        (tmp_path / name / "azure_replay").mkdir()
        pd.DataFrame({"rid": range(n)}).to_parquet(tmp_path / name / "azure_replay" / "measured_requests.parquet")
    monkeypatch.setattr(sys, "argv", ["validation_runs.py", str(tmp_path), "--out", str(tmp_path / "t")])
    with pytest.raises(ValueError, match="different request counts"):
        V.main()
