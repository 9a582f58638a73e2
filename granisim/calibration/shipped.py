"""Regenerate the measured H200 and H100 profiles and the what-if profile derived from the H200's.

    python -m granisim.calibration.shipped [RAW_DIR]     # default calibration/raw/h200

1. fits RAW_DIR (granisim.calibration) into granisim/config/profiles/h200.json, its two measured tables
   into granisim/config/data/, and writes the report figures and fit summary into reports/calibration/;
   then adds the measurements of calibration/raw/h200_more/: Qwen-2.5-14B's own linear table and the shard
   GEMMs of Llama-3.1-70B and Qwen-2.5-72B (granisim.calibration.more_table), and the MoE grouped GEMMs
   (granisim.calibration.moe_fit), the decode kernel's re-read share of a shared prefix
   (granisim.calibration.reread, from h200_more/shared_decode_pool6m), and how much slower a skewed decode batch
   streams (granisim.calibration.skew, from reports/kernels/split_balance/split_balance_run3.json);
2. fits calibration/raw/h100/measure (the same measurement on an H100) into granisim/config/profiles/h100-sxm.json
   and its tables, with the tp and MoE coefficients extrapolated as for the others, Qwen-2.5-14B's own linear
   table (calibration/raw/h100/qwen-2.5-14b_linear), the kernel's re-read share from
   calibration/raw/h100/shared_decode, and the skewed decode's factor from the split-balance benchmark's H100 run
   (reports/kernels/split_balance/split_balance_h100.json);
3. derives granisim/config/profiles/b200.json from h200 by datasheet ratios.
Coefficients other runs measured (the host tier's link and overlap) stay as they were in each file.

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
from granisim.calibration.reread import add_to_file as add_kernel_reread
from granisim.calibration.run import calibrate, format_errors, write_figures
from granisim.calibration.skew import add_to_file as add_skew_stream
from granisim.costmodel import m_sat_threshold
from granisim.config.hardware import DATA_DIR, PROFILE_DIR, load_profile
from granisim.config.models import get_model

COMMAND = ("python -m calibration.measure --gpu h200 --model llama-3.1-8b --out RAW (calibration/raw/h200); "
           "granisim calibrate fit RAW --out h200.json (python -m granisim.calibration.shipped)")


MORE = ROOT / "calibration" / "raw" / "h200_more"
# the split-balance benchmark's run 3 on the H200, and its date, code and versions (its JSON records the torch only;
# reports/kernels/split_balance/README.md)
SPLIT_BALANCE = ROOT / "reports" / "kernels" / "split_balance" / "split_balance_run3.json"
SPLIT_BALANCE_RUN = ("2026-11-29", "5e12dbd", "torch 2.11.0+cu130, triton 3.6.0")
H100 = ROOT / "calibration" / "raw" / "h100" / "measure"
H100_REREAD = ROOT / "calibration" / "raw" / "h100" / "shared_decode"
H100_QWEN_LINEAR = ROOT / "calibration" / "raw" / "h100" / "qwen-2.5-14b_linear"
SPLIT_BALANCE_H100 = ROOT / "reports" / "kernels" / "split_balance" / "split_balance_h100.json"
H100_COMMAND = ("python -m calibration.measure --gpu h200 --model llama-3.1-8b --out RAW on an H100 (--gpu only labels "
                "the run; calibration/raw/h100/measure); granisim calibrate fit RAW --out h100-sxm.json --name h100-sxm "
                "(python -m granisim.calibration.shipped)")


def add_more(profile: Path) -> None:
    """The H200 measurements beside the main run: linear tables at other models' shapes, the grouped GEMMs."""
    for raw in ("qwen-2.5-14b_linear_2", "llama-3.1-70b_linear_tp", "qwen-2.5-72b_linear_tp"):
        add_table(MORE / raw, profile, DATA_DIR)
    prof = load_profile(profile)
    raw = MORE / "qwen3-30b-a3b_grouped_gemm"
    write_grouped(profile, raw, fit_grouped(raw, prof.bf16_flops, prof.hbm_bandwidth)[0])


def keep_others(path: Path, before: dict) -> None:
    """Put back the coefficients the file had and the refit did not write: those other runs own (the host
    tier's link and overlap: calibration.measure.host_link and copy_overlap), each with its own source."""
    doc = json.loads(path.read_text())
    gone = {k: v for k, v in before.get("coefficients", {}).items() if k not in doc["coefficients"]}
    if gone:
        doc["coefficients"].update(gone)
        path.write_text(json.dumps(doc, indent=2) + "\n")


def fit_into(raw: Path, shipped: Path, name: str, command: str):
    """Fit the raw run ``raw`` into the profile ``shipped`` (its tables into DATA_DIR, its figures and fit summary
    into reports/calibration/), then add the tp all-reduce curve and MoE coefficients (extrapolated)."""
    with tempfile.TemporaryDirectory() as tmp:  # the profile's tables are written beside it and into DATA_DIR
        out = Path(tmp) / f"{name}.json"
        cal = calibrate(raw, out, name=name, command=command, extra_table_dirs=[DATA_DIR])
        print(f"{name}:\n{format_errors(cal.result)}")
        write_figures(cal, ROOT / "reports" / "calibration", name)
        shutil.copyfile(out, shipped)
    add_parallel(shipped)
    return cal


def main(raw_dir: str = "calibration/raw/h200") -> None:
    shipped = PROFILE_DIR / "h200.json"
    before = {t: json.loads((PROFILE_DIR / f"{t}.json").read_text()) for t in ("h200", "h100-sxm", "b200")
              if (PROFILE_DIR / f"{t}.json").is_file()}
    cal = fit_into(ROOT / raw_dir, shipped, "h200", COMMAND)
    add_more(shipped)  # other models' tables; the MoE grouped GEMMs replaced by their measurement
    keep_others(shipped, before.get("h200", {}))
    add_kernel_reread(MORE / "shared_decode_pool6m", shipped)
    add_skew_stream(SPLIT_BALANCE, shipped, *SPLIT_BALANCE_RUN)
    h100 = PROFILE_DIR / "h100-sxm.json"
    fit_into(H100, h100, "h100-sxm", H100_COMMAND)
    keep_others(h100, before.get("h100-sxm", {}))
    add_table(H100_QWEN_LINEAR, h100, DATA_DIR)
    add_kernel_reread(H100_REREAD, h100)
    add_skew_stream(SPLIT_BALANCE_H100, h100)  # the run's JSON records its date, commit and versions
    b200 = PROFILE_DIR / "b200.json"
    b200.write_text(json.dumps(derive(cal.doc, "b200", source_name="h200 (granisim/config/profiles/h200.json)"),
                               indent=2) + "\n")
    add_parallel(b200)
    keep_others(b200, before.get("b200", {}))
    model = get_model("llama-3.1-8b")
    for path in (h100, b200):
        prof = load_profile(path)
        xs = {lp: m_sat_threshold(prof, model, lp) for lp in (1024, 4096, 16384, 32768)}
        print(f"{prof.name}: m_sat {prof.m_sat}; formula best threshold by L_p {xs}")
    prof = load_profile(shipped)
    print(f"h200: m_sat {prof.m_sat}; per L_p measured {cal.msat['per_L_measured']}; profile crossover "
          f"{cal.msat['per_L_model']}")


def cli(argv: list[str] | None = None) -> int:
    from granisim.config.files import OneLineParser

    ap = OneLineParser(prog="python -m granisim.calibration.shipped",
                       description="Refit the shipped h200 profile from a raw calibration run, h100-sxm from the H100 run "
                                   "and derive b200 from h200 (rewrites granisim/config/profiles/, granisim/config/data/ "
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
