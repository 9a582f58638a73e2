"""Regenerate the measured H200 profile and the what-if profiles derived from it.

    .venv/bin/python scripts/make_calibrated_profiles.py [RAW_DIR]     # default calibration/raw/h200

1. fits RAW_DIR (granisim.calibration) into calibration/profiles/h200.json (+ its two tables) and
   writes the report figures and fit summary into reports/calibration/;
2. ships it: granisim/profiles/h200.json = that profile, its tables copied into granisim/data/;
3. derives granisim/profiles/h100-sxm.json and b200.json from it by datasheet ratios.

a100-80gb is untouched (scripts/make_profiles.py makes it from published sources).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from granisim.calibration.profile import derive  # noqa: E402
from granisim.calibration.run import calibrate, format_errors, write_figures  # noqa: E402
from granisim.costmodel import m_sat_threshold  # noqa: E402
from granisim.hardware import DATA_DIR, PROFILE_DIR, load_profile  # noqa: E402
from granisim.models import get_model  # noqa: E402

COMMAND = ("python -m calibration.measure --gpu h200 --model llama-3.1-8b --out RAW (calibration/raw/h200); "
           "granisim calibrate fit RAW --out calibration/profiles/h200.json (scripts/make_calibrated_profiles.py)")


def main(raw_dir: str = "calibration/raw/h200") -> None:
    out = ROOT / "calibration" / "profiles" / "h200.json"
    cal = calibrate(ROOT / raw_dir, out, name="h200", command=COMMAND, extra_table_dirs=[DATA_DIR])
    print(format_errors(cal.result))
    write_figures(cal, ROOT / "reports" / "calibration", "h200")
    shipped = PROFILE_DIR / "h200.json"
    shipped.write_text(out.read_text())
    load_profile(shipped)
    model = get_model("llama-3.1-8b")
    for target in ("h100-sxm", "b200"):
        doc = derive(cal.doc, target, source_name="h200 (calibration/profiles/h200.json)")
        path = PROFILE_DIR / f"{target}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        prof = load_profile(path)
        xs = {lp: m_sat_threshold(prof, model, lp) for lp in (1024, 4096, 16384, 32768)}
        print(f"{target}: m_sat {prof.m_sat}; formula best threshold by L_p {xs}")
    prof = load_profile(shipped)
    print(f"h200: m_sat {prof.m_sat}; per L_p measured {cal.msat['per_L_measured']}; profile crossover "
          f"{cal.msat['per_L_model']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
