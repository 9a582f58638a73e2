"""Would a power/clock term help? Per-step errors by step size, with and without a first-order heat term.

    granisim validation clock-term RAW/validation/runG1 RAW/validation/runH1 [--profile h200-engine]
        [--sustained reports/validation/sustained/sustained_load.json] [--tau 0.3 1.0] [--out clock_term.json]

Under a sustained load the H200 sits at its power cap and its large GEMMs run slower
(``granisim.validation.gpu_log``; ``gpu_backend.bench.sustained_load``). The candidate term: a heat state
``h`` in [0, 1] that rises towards 1 with time constant ``tau`` while the GPU runs a compute-bound step
(at least ``--hot-tokens`` new tokens) and decays towards 0 with the same constant otherwise; such a step's
linear part is priced ``1 + a_linear * h_mean`` times, its prefill attention ``1 + a_attn * h_mean`` times,
with ``a`` the sustained-load slowdowns measured against the same kernels cold (the largest GEMM and the
4K-token prefill of the benchmark). The steps of every unit of the runs (all policies and models found) are
priced with PROFILE and walked in order, back to back (the stored plans do not record idle gaps, so this
is an upper bound on the heat). The table gives the median signed per-step error in step-size bins over the
units outside the held-out workloads, and the mean of the units' median absolute errors: a term worth adding
lowers the latter. Nothing here needs a GPU. Bad input (a missing folder or file) raises ValueError: one line and
exit 2 from the CLI.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.config.hardware import get_profile
from granisim.config.models import get_model
from granisim.validation.gpu_runs import VALIDATION, split_unit
from granisim.validation.report import _load, held_out
from granisim.validation.validate import reprice
from granisim.config.files import OneLineParser, one_line

BINS = (0, 8, 64, 512, 2048, 4096, 8192, math.inf)


def heated(tokens, linear, attn, rest, *, tau: float, hot_tokens: int, a_linear: float, a_attn: float):
    """Step durations with the heat term, steps back to back in order (pure; arrays of one run's steps)."""
    h, out = 0.0, np.empty(len(tokens))
    for i, (t, lin, att, r) in enumerate(zip(tokens, linear, attn, rest)):
        d = lin + att + r
        if t >= hot_tokens and d > 0:
            h_mean = 1.0 - (1.0 - h) * tau / d * (1.0 - math.exp(-d / tau))
            d = r + lin * (1.0 + a_linear * h_mean) + att * (1.0 + a_attn * h_mean)
            h = 1.0 - (1.0 - h) * math.exp(-d / tau)
        else:
            h *= math.exp(-d / tau)
        out[i] = d
    return out


def amplitudes(sustained: Path) -> tuple[float, float]:
    """(a_linear, a_attn): the largest GEMM's and the prefill attention's slowdown under load vs cold."""
    try:
        table = {r["kernel"]: r for r in json.loads(sustained.read_text())["table"]}
        gemms = [r for r in table.values() if r["kernel"].startswith("gemm_")]
        big = max(gemms, key=lambda r: r["cold_us"])
        attn = next(r for r in table.values() if r["kernel"].startswith("prefill_attn"))
        return float(big["load_vs_cold"]), float(attn["load_vs_cold"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration) as err:
        why = one_line(err) or type(err).__name__
        raise ValueError(f"{sustained}: not a sustained-load JSON with gemm_* and prefill_attn* rows in its table "
                         f"({why})") from None


def units_folder(run: Path) -> Path:
    """Where a run folder keeps its units: its h200_run/ when it has one, else the folder itself."""
    return run / "h200_run" if (run / "h200_run").is_dir() else run


def policy_models(run: Path) -> list[tuple[str, str]]:
    """The (policy, model) pairs with units in a run folder, in the order of their validation_*.json names."""
    found = {}
    for js in sorted(units_folder(run).glob("validation_*.json")):
        parsed = split_unit(js.stem[len("validation_"):])
        if parsed is not None:
            found.setdefault((parsed[1], parsed[2]), None)
    return list(found)


def run_units(run: Path):
    """(unit name, steps, plans, model) of every unit in a run folder."""
    h200 = units_folder(run)
    for policy, model in policy_models(run):
        names, steps, plans = _load(h200, policy, model)
        for n in names:
            yield f"{run.name}/{n}", steps[n], plans[n], model


def _score(frames: list[pd.DataFrame], col: str) -> dict:
    df = pd.concat(frames, ignore_index=True)
    df = df[~df.held_out]
    err = df[col] / df.measured_s - 1.0
    labels = [f"{lo + 1}-{hi:g}" if hi != math.inf else f"> {lo}" for lo, hi in zip(BINS, BINS[1:])]
    bins = pd.cut(df.tokens, BINS, right=True, labels=labels)
    by_bin = err.groupby(bins, observed=True).median()
    unit_median = err.abs().groupby(df.unit).median()
    return {"by_tokens": {str(k): float(v) for k, v in by_bin.items()},
            "mean_unit_median_abs": float(unit_median.mean()), "units": int(unit_median.size)}


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation clock-term", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run folders (each holding h200_run/ or the units)")
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--sustained", type=Path, default=Path("reports/validation/sustained/sustained_load.json"))
    ap.add_argument("--tau", type=float, nargs="+", default=[0.1, 0.3, 1.0], help="time constants (s)")
    ap.add_argument("--hot-tokens", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    for run in args.runs:
        if not run.is_dir():
            raise ValueError(f"{run}: no such run folder")
    if not args.sustained.is_file():
        raise ValueError(f"{args.sustained}: no such file (gpu_backend.bench.sustained_load writes it)")
    a_lin, a_attn = amplitudes(args.sustained)
    prof = get_profile(args.profile)
    frames = []
    for unit, steps, plans, model in (u for run in args.runs for u in run_units(run)):
        s = reprice(steps, plans, prof, get_model(model))
        frames.append(s.assign(unit=unit, held_out=held_out(unit.split("/", 1)[1])))
    if not frames:
        raise ValueError(f"no validation units under {', '.join(map(str, args.runs))}")
    rows = [{"term": "none", **_score(frames, "predicted_s")}]
    for tau in args.tau:
        for hot in args.hot_tokens:
            for f in frames:
                rest = f.predicted_s - f.predicted_linear - f.predicted_attn_prefill
                f["heated_s"] = heated(f.tokens.to_numpy(), f.predicted_linear.to_numpy(),
                                       f.predicted_attn_prefill.to_numpy(), rest.to_numpy(), tau=tau,
                                       hot_tokens=hot, a_linear=a_lin, a_attn=a_attn)
            rows.append({"term": f"tau {tau:g} s, hot >= {hot} tokens", **_score(frames, "heated_s")})
    labels = list(rows[0]["by_tokens"])
    print(f"a_linear {a_lin:+.3f}, a_attn {a_attn:+.3f} ({args.sustained}); profile {args.profile}; "
          f"{rows[0]['units']} units outside the held-out workloads ({', '.join(w for w in VALIDATION if held_out(w))})")
    print("| term | mean of the units' median abs error | " + " | ".join(f"tokens {b}" for b in labels) + " |")
    print("|---|---:|" + "---:|" * len(labels))
    for r in rows:
        cells = " | ".join(f"{100 * r['by_tokens'].get(b, float('nan')):+.1f}%" for b in labels)
        print(f"| {r['term']} | {100 * r['mean_unit_median_abs']:.2f}% | {cells} |")
    if args.out:
        args.out.write_text(json.dumps({"profile": args.profile, "a_linear": a_lin, "a_attn": a_attn,
                                        "runs": list(map(str, args.runs)), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
