"""How far each validation workload's predicted metrics move with every step a few percent slower or faster.

    granisim validation sensitivity [--profile h200-engine] [--delta 0.03] [--models M ...] [--policies P ...]
        [--only WORKLOAD ...] [--out JSON] [--table MD]

For every validation workload (``gpu_runs.VALIDATION``), policy and model: the simulated run on ``--profile`` as
the validation report simulates it, and again with ``hardware.step_time_scale`` at 1 - delta and 1 + delta. A
target check is only as sharp as its metric: where 3% of step time moves a tail by 15%, a miss of that size
needs no more than the per-step error the runs measure, and a fix of one step class can move it either way.
CPU only, about a second a simulation.
"""
from __future__ import annotations

import json
from pathlib import Path

from granisim.config.files import OneLineParser, one_line

METRICS = ("throughput_rps", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s")
LABELS = ("throughput", "TPOT p50", "TPOT p99", "TTFT p50", "TTFT p99")


def unit_sensitivity(workload: str, policy: str, model: str, profile: str, delta: float) -> dict:
    """{metric: (change at 1 - delta, change at 1 + delta)} of one validation unit, simulated."""
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate
    from granisim.experiments.sensitivity import scaled_summaries
    from granisim.validation.gpu_runs import validation_scenario

    sc = validation_scenario(workload, None, profile, policy, model)
    res = simulate(prepare(sc), progress=False)
    base = summarize(requests_frame(res.records), res.steps.frame(), res.end_s)
    scaled = scaled_summaries(sc, f"validation workload {workload}", delta)
    return {m: tuple((scaled[f][m] - base[m]) / base[m] for f in sorted(scaled)) for m in METRICS}


def format_table(rows: list[dict], delta: float, profile: str) -> str:
    lines = [f"change of each predicted metric with every step x {1 - delta:g} / x {1 + delta:g} ({profile}):", "",
             "| model | workload | policy | " + " | ".join(LABELS) + " |", "|" + "---|" * (3 + len(LABELS))]
    for r in rows:
        lines.append(f"| {r['model']} | {r['workload']} | {r['policy']} | "
                     + " | ".join(f"{r[m][0]:+.1%} / {r[m][1]:+.1%}" for m in METRICS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from granisim.validation.gpu_runs import MODELS, POLICIES, VALIDATION

    ap = OneLineParser(prog="granisim validation sensitivity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--delta", type=float, default=0.03, help="step-time change, a fraction (default 0.03)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--only", nargs="+", choices=list(VALIDATION), help="these workloads (default: all)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    ap.add_argument("--table", type=Path, help="write the markdown table here (it is printed either way)")
    args = ap.parse_args(argv)
    if not 0 < args.delta < 0.5:
        ap.error(f"--delta {args.delta}: give a fraction between 0 and 0.5, e.g. 0.03")
    rows = []
    for model in args.models:
        for w in args.only or VALIDATION:
            for pol in args.policies:
                try:
                    sens = unit_sensitivity(w, pol, model, args.profile, args.delta)
                except ValueError as err:  # a bad --policies name or --profile: one line, exit 2
                    ap.error(one_line(err, None))
                rows.append({"model": model, "workload": w, "policy": pol, **sens})
    text = format_table(rows, args.delta, args.profile)
    print(text, end="")
    if args.table:
        args.table.write_text(text)
    if args.out:
        args.out.write_text(json.dumps({"profile": args.profile, "delta": args.delta, "rows": rows}, indent=1) + "\n")
