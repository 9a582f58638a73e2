"""What waiting out the gaps between arrivals changes: the same unit run with and without idling.

    granisim validation idle-effect --idle RUN ... --no-idle RUN ... [--out idle_effect.json]

Each RUN is a ``gpu-run validate`` output folder holding one unit's ``validation_*.json``, the unit's folder
(``steps.parquet``) and ``gpu_log.csv`` (``--log-gpu``); the idle runs are plain, the others ran with
``--no-idle``. Run them alternated on one machine (idle, no-idle, idle, ...) so that drift falls on both.
Per run: the measured end-to-end figures, the median measured time of the small decode steps (at most 64
new tokens) and of the large prefill steps (over 2048), and the clock/power log over the unit's window; then
per figure the median over each mode's runs, their range, and the ratio of the medians (no-idle / idle).
Only measured figures: the prediction is the same for both modes. Bad input (a folder without a unit)
raises ValueError: one line and exit 2 from the CLI.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.validation.gpu_log import log_summary, read_gpu_log
from granisim.config.files import OneLineParser, one_line

E2E = ("throughput_rps", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s")
SMALL_TOKENS, LARGE_TOKENS = 64, 2048


def run_figures(run: Path) -> dict:
    """The measured figures of the one unit in ``run``."""
    reps = sorted(run.glob("validation_*.json"))
    if len(reps) != 1:
        raise ValueError(f"{run}: expected one validation_*.json, found {len(reps)}")
    unit = reps[0].stem.removeprefix("validation_")
    steps_file = run / unit / "steps.parquet"
    if not steps_file.is_file():
        raise ValueError(f"{steps_file}: no such file")
    try:
        rep = json.loads(reps[0].read_text())
        figures = {"idle": bool(rep.get("idle")), "idled_s": float(rep.get("idled_s", 0.0)),
                   "wall_s": float(rep["wall_s"]), **{k: float(rep["end_to_end"][k]["measured"]) for k in E2E}}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{reps[0]}: not a validation report with wall_s and the measured end_to_end figures "
                         f"({one_line(err)})") from None
    steps = pd.read_parquet(steps_file, columns=["tokens", "measured_s"])
    out = {"run": str(run), "unit": unit, "idle": figures.pop("idle"), "idled_s": figures.pop("idled_s"),
           "wall_s": figures.pop("wall_s"), "steps": int(len(steps)), **figures}
    small = steps.measured_s[steps.tokens <= SMALL_TOKENS]
    large = steps.measured_s[steps.tokens > LARGE_TOKENS]
    out["small_step_p50_s"] = float(small.median()) if len(small) else float("nan")
    out["large_step_p50_s"] = float(large.median()) if len(large) else float("nan")
    log = run / "gpu_log.csv"
    if log.is_file():
        s = log_summary(read_gpu_log(log), datetime.fromisoformat(rep["started_local"]),
                        datetime.fromisoformat(rep["ended_local"]))
        out.update({k: s.get(k, float("nan")) for k in ("sm_mhz_p50", "sm_mhz_p10", "power_w_p50",
                                                         "power_capped_share")})
    return out


def compare(idle: list[dict], no_idle: list[dict]) -> list[dict]:
    """Per figure: each mode's median and range over its runs, and the ratio of the medians (pure)."""
    rows = []
    for k in (*E2E, "small_step_p50_s", "large_step_p50_s", "sm_mhz_p50", "sm_mhz_p10", "power_w_p50",
              "power_capped_share", "idled_s"):
        a = np.array([r.get(k, np.nan) for r in idle], float)
        b = np.array([r.get(k, np.nan) for r in no_idle], float)
        if np.isnan(a).all() or np.isnan(b).all():
            continue
        ma, mb = float(np.nanmedian(a)), float(np.nanmedian(b))
        rows.append({"figure": k, "idle_median": ma, "idle_min": float(np.nanmin(a)), "idle_max": float(np.nanmax(a)),
                     "noidle_median": mb, "noidle_min": float(np.nanmin(b)), "noidle_max": float(np.nanmax(b)),
                     "ratio": mb / ma if ma else float("nan")})
    return rows


def _fmt(k: str, v: float) -> str:
    if k.endswith("_s") and k != "idled_s":
        return f"{v * 1e3:.2f} ms"
    if k == "power_capped_share":
        return f"{v:.0%}"
    return f"{v:.3g}" if k == "throughput_rps" else f"{v:.0f}"


def table(rows: list[dict], n_idle: int, n_noidle: int) -> str:
    lines = [f"| figure | idle (median of {n_idle}; range) | no idle (median of {n_noidle}; range) | no idle / idle |",
             "| --- | --- | --- | ---: |"]
    for r in rows:
        k = r["figure"]
        lines.append(f"| {k} | {_fmt(k, r['idle_median'])} ({_fmt(k, r['idle_min'])}..{_fmt(k, r['idle_max'])}) | "
                     f"{_fmt(k, r['noidle_median'])} ({_fmt(k, r['noidle_min'])}..{_fmt(k, r['noidle_max'])}) | "
                     f"{r['ratio']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation idle-effect", description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=Path, nargs="+", required=True, help="run folders of the plain (idling) runs")
    ap.add_argument("--no-idle", type=Path, nargs="+", required=True, help="run folders of the --no-idle runs")
    ap.add_argument("--out", type=Path, help="write the runs and the comparison as JSON")
    args = ap.parse_args(argv)
    for run in (*args.idle, *args.no_idle):
        if not run.is_dir():
            raise ValueError(f"{run}: no such run folder")
    idle = [run_figures(r) for r in args.idle]
    no_idle = [run_figures(r) for r in args.no_idle]
    for mode, runs in ((True, idle), (False, no_idle)):
        for r in runs:
            if r["idle"] != mode:
                raise ValueError(f"{r['run']}: its unit ran with idle = {r['idle']}, listed under the other mode")
    if len({r["unit"].removesuffix("_noidle") for r in idle + no_idle}) != 1:
        units = sorted({r["unit"] for r in idle + no_idle})
        raise ValueError("the runs are not all of the same unit: " + ", ".join(units))
    rows = compare(idle, no_idle)
    print(table(rows, len(idle), len(no_idle)))
    if args.out:
        args.out.write_text(json.dumps({"runs": idle + no_idle, "comparison": rows}, indent=1) + "\n")
