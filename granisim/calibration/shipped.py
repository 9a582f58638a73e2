"""Regenerate the measured H200 profile and the what-if profiles derived from it.

    python -m granisim.calibration.shipped [RAW_DIR]     # default calibration/raw/h200

1. fits RAW_DIR (granisim.calibration) into granisim/config/profiles/h200.json, its two measured tables
   into granisim/config/data/, and writes the report figures and fit summary into reports/calibration/;
   then adds the measurements of calibration/raw/h200_more/: Qwen-2.5-14B's own linear table and the shard
   GEMMs of Llama-3.1-70B and Qwen-2.5-72B (granisim.calibration.more_table), and the MoE grouped GEMMs
   (granisim.calibration.moe_fit);
2. derives granisim/config/profiles/h100-sxm.json and b200.json from it by datasheet ratios.

a100-80gb is untouched (``python -m granisim.calibration.published`` makes it from published sources).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from granisim.calibration.collectives import add_to_file as add_parallel
from granisim.calibration.moe_fit import fit_grouped, write as write_grouped
from granisim.calibration.more_table import add_table
from granisim.calibration.profile import derive
from granisim.calibration.run import calibrate, format_errors, write_figures
from granisim.costmodel import m_sat_threshold
from granisim.config.hardware import DATA_DIR, PROFILE_DIR, load_profile
from granisim.config.models import get_model

COMMAND = ("python -m calibration.measure --gpu h200 --model llama-3.1-8b --out RAW (calibration/raw/h200); "
           "granisim calibrate fit RAW --out h200.json (python -m granisim.calibration.shipped)")


MORE = ROOT / "calibration" / "raw" / "h200_more"


def add_more(profile: Path) -> None:
    """The H200 measurements beside the main run: linear tables at other models' shapes, the grouped GEMMs."""
    for raw in ("qwen-2.5-14b_linear_2", "llama-3.1-70b_linear_tp", "qwen-2.5-72b_linear_tp"):
        add_table(MORE / raw, profile, DATA_DIR)
    prof = load_profile(profile)
    raw = MORE / "qwen3-30b-a3b_grouped_gemm"
    write_grouped(profile, raw, fit_grouped(raw, prof.bf16_flops, prof.hbm_bandwidth)[0])


def main(raw_dir: str = "calibration/raw/h200") -> None:
    shipped = PROFILE_DIR / "h200.json"
    with tempfile.TemporaryDirectory() as tmp:  # the profile's tables are written beside it and into DATA_DIR
        out = Path(tmp) / "h200.json"
        cal = calibrate(ROOT / raw_dir, out, name="h200", command=COMMAND, extra_table_dirs=[DATA_DIR])
        print(format_errors(cal.result))
        write_figures(cal, ROOT / "reports" / "calibration", "h200")
        shutil.copyfile(out, shipped)
    add_parallel(shipped)  # the tp all-reduce curve (extrapolated) and MoE grouped-GEMM coefficients
    add_more(shipped)  # ... the latter replaced by their measurement
    model = get_model("llama-3.1-8b")
    for target in ("h100-sxm", "b200"):
        doc = derive(cal.doc, target, source_name="h200 (granisim/config/profiles/h200.json)")
        path = PROFILE_DIR / f"{target}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        add_parallel(path)
        prof = load_profile(path)
        xs = {lp: m_sat_threshold(prof, model, lp) for lp in (1024, 4096, 16384, 32768)}
        print(f"{target}: m_sat {prof.m_sat}; formula best threshold by L_p {xs}")
    prof = load_profile(shipped)
    print(f"h200: m_sat {prof.m_sat}; per L_p measured {cal.msat['per_L_measured']}; profile crossover "
          f"{cal.msat['per_L_model']}")


def cli(argv: list[str] | None = None) -> int:
    from granisim.config.files import OneLineParser

    ap = OneLineParser(prog="python -m granisim.calibration.shipped",
                       description="Refit the shipped h200 profile from a raw calibration run and derive h100-sxm "
                                   "and b200 from it (rewrites granisim/config/profiles/, granisim/config/data/ "
                                   "and reports/calibration/).")
    ap.add_argument("raw_dir", nargs="?", default="calibration/raw/h200",
                    help="raw run folder, relative to the checkout (default calibration/raw/h200)")
    args = ap.parse_args(argv)
    if not (ROOT / args.raw_dir).is_dir():  # before anything is rewritten
        print(f"error: {ROOT / args.raw_dir}: no such raw run folder", file=sys.stderr)
        return 2
    main(args.raw_dir)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
