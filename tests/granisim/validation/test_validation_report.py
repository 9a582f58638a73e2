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
    with pytest.raises(SystemExit, match=r"measured_requests.parquet: the run measured 96 requests, --requests 64"):
        V.run_requests(d, "control_short", 64)
    with pytest.raises(SystemExit, match="missing, and no --requests given"):
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
    with pytest.raises(SystemExit, match=r"validation_control_short.json: executor.graph_max_rows missing"):
        V.graph_limit(tmp_path / "d", ["control_short"], steps)
