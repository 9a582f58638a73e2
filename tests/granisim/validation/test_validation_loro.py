"""scripts/validation_loro.py: each run judged by a fit on the other runs."""
import json
import sys
from pathlib import Path

import pytest


import granisim.validation.loro as L
from granisim.validation.targets import WORKLOADS


def _report(folder: Path, err: float) -> None:
    """A validation_report.py h200.json whose check_profile variant has error `err` everywhere."""
    e2e = {m: {"error": err} for m in ("throughput_rps", "tpot_p50_s", "tpot_p99_s", "ttft_p99_s")}
    folder.mkdir(parents=True)
    (folder / "h200.json").write_text(json.dumps({"workloads": {w: {"check_profile": {
        "step_errors": {"total": {"median": err}}, "end_to_end": e2e}} for w in WORKLOADS}}))


def test_the_table_marks_misses_per_run(tmp_path):
    _report(tmp_path / "run1", 0.02)
    _report(tmp_path / "run2", -0.06)
    text = L.table(tmp_path, ["1", "2"])
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[2:]}
    assert rows["per-step median <= 3%"].split("|")[2].strip() == "2.0 / 2.0 / 2.0%"
    assert rows["per-step median <= 3%"].split("|")[3].strip() == "**6.0** / **6.0** / **6.0**%"
    assert rows["TTFT p99 <= 10%"].split("|")[3].strip() == "6.0 / 6.0 / 6.0%"  # within its 10% bound


def test_bad_arguments_are_refused(tmp_path, monkeypatch):
    out = str(tmp_path / "o")
    monkeypatch.setattr(sys, "argv", ["validation_loro.py", "13", "--root", str(tmp_path), "--out", out])
    with pytest.raises(ValueError, match="at least two runs"):  # the CLI: one line, exit 2
        L.main()
    monkeypatch.setattr(sys, "argv", ["validation_loro.py", "13", "14", "--root", str(tmp_path), "--out", out])
    with pytest.raises(ValueError, match=r"run13/h200_run: no such run folder"):
        L.main()
