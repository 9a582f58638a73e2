"""scripts/validation_targets.py: the targets table of two runs, misses in bold."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import validation_targets as T  # noqa: E402


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
