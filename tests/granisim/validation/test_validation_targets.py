"""scripts/validation_targets.py: the targets table of two runs, misses in bold."""
import json
import sys
from pathlib import Path


import granisim.validation.targets as T


def _report(root: Path, run: str, tpot_err: float) -> None:
    e2e = {m: {"error": 0.01} for m in T.TARGETS if m != "step_median"}
    e2e["tpot_p50_s"] = {"error": tpot_err}
    variant = {"step_errors": {"total": {"median": 0.02}}, "end_to_end": e2e}
    report = {"workloads": {w: {"engine_calibrated_held_out": variant, "check_profile": variant} for w in T.WORKLOADS}}
    (root / f"run{run}").mkdir()
    (root / f"run{run}" / "h200.json").write_text(json.dumps(report))


def test_misses_are_bold_and_signs_do_not_hide_them(tmp_path):
    _report(tmp_path, "1", -0.062)  # a prediction 6.2% under is a miss of the 5% target
    _report(tmp_path, "2", 0.049)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in T.table(tmp_path, "1", "2").splitlines()}
    tpot = rows["TPOT p50 <= 5%"].split(" | ")
    assert tpot[1] == "**6.2** / **6.2** / **6.2**%" and tpot[2] == "4.9 / 4.9 / 4.9%"
    assert "**" not in rows["per-step median <= 3%"]


def test_profile_check_table_reads_each_runs_subfolder(tmp_path):
    """--profile-check SUB: one column per run, read from runX/SUB/h200.json, named by the profile it checked."""
    for run, err in (("1", 0.03), ("2", 0.07)):
        _report(tmp_path, run, err)
        report = json.loads((tmp_path / f"run{run}" / "h200.json").read_text())
        for w in T.WORKLOADS:
            report["workloads"][w]["check_profile"]["profile"] = "granisim/config/profiles/h200-engine.json"
        (tmp_path / f"run{run}" / "shipped").mkdir()
        (tmp_path / f"run{run}" / "shipped" / "h200.json").write_text(json.dumps(report))
        (tmp_path / f"run{run}" / "h200.json").write_text("{}")  # the run's own report is not read
    lines = T.profile_check_table(tmp_path, ["1", "2"], "shipped").splitlines()
    assert lines[0] == "| target | run 1, h200-engine | run 2, h200-engine |"
    tpot = next(line for line in lines if line.startswith("| TPOT p50")).split(" | ")
    assert tpot[1] == "3.0 / 3.0 / 3.0%" and tpot[2] == "**7.0** / **7.0** / **7.0**% |"
