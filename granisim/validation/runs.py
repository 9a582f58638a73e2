"""Run-to-run table: the end-to-end metrics measured in several validation runs beside one prediction.

    granisim validation runs RAW/validation --runs runA1 runA2 --profile h200-engine --out reports/validation/runs

Reads every ``RUN/validation_<workload>.json`` under the given folders (as written by
``granisim validation gpu-run validate``; variants such as ``_gc`` are rows of their own), and prices
each workload once with the simulator alone under ``--profile``. Shows how far apart the real
engine's own runs are, so a prediction error can be set against that spread; and how far the
simulator's own prediction moves when every step is 1% shorter or longer (``--sensitivity``: the
schedule's sensitivity, e.g. when prefill chunks interleave with decoding). No GPU needed.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from granisim.validation.gpu_runs import VALIDATION
from granisim.costmodel.executor import CostExecutor
from granisim.core.metrics import requests_frame, summarize
from granisim.experiments.run import simulate
from granisim.validation.report import _setup, run_requests
from granisim.config.files import OneLineParser, one_line

METRICS = ("throughput_rps", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


def _runs(root: Path, only: list[str] | None = None) -> dict[str, Path]:
    """Run folder name -> folder holding its validation_*.json (the run itself or its h200_run/); with
    `only`, the runs whose folder is one of these or lies under one (e.g. one engine version's runs)."""
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder of runs")
    found = {}
    for js in sorted(root.rglob("validation_*.json")):
        name = str(js.parent.relative_to(root))
        if only is None or any(name == o or name.startswith(o + "/") for o in only):
            found.setdefault(name, js.parent)
    if not found:
        raise ValueError(f"{root}: no validation_*.json under it" + (f" in --runs {' '.join(only)}" if only else ""))
    return found


class _Scaled(CostExecutor):
    """The cost model with every step's duration times ``factor``."""

    def __init__(self, profile, model, factor: float):
        super().__init__(profile, model)
        self.factor = factor

    def execute(self, plan):
        r = super().execute(plan)
        f = self.factor
        return replace(r, duration_s=r.duration_s * f, breakdown={k: v * f for k, v in r.breakdown.items()},
                       step_durations=tuple(d * f for d in r.step_durations) if r.step_durations else None)


def _simulated(setup, factor: float = 1.0) -> dict:
    res = simulate(setup, _Scaled(setup.profile, setup.model, factor), progress=False)
    return summarize(requests_frame(res.records), res.steps.frame(), res.end_s)


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation runs", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--requests", type=int, help="the runs' request cap (default: as the runs measured)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sensitivity", type=float, nargs="*", default=[0.99, 1.01],
                    help="step-duration factors to simulate beside 1.0")
    ap.add_argument("--runs", nargs="*", help="only these run folders under ROOT (default: every run)")
    args = ap.parse_args(argv)
    rows, measured, sizes = [], {}, {}
    for run, folder in _runs(args.root, args.runs).items():
        for js in sorted(folder.glob("validation_*.json")):
            name = js.stem[len("validation_"):]
            base = next((w for w in VALIDATION if name == w or name.startswith(w + "_")), None)
            if base is None:
                continue
            sizes.setdefault(base, {})[run] = run_requests(folder / name, base, args.requests)
            try:
                e2e = json.loads(js.read_text())["end_to_end"]
                vals = {m: e2e[m]["measured"] for m in METRICS}
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{js}: not a validation report with the measured end_to_end figures "
                                 f"({one_line(err)})") from None
            rows.append({"run": run, "workload": name, **vals})
            measured.setdefault(base, []).append(vals)
    for w, by_run in sizes.items():  # one prediction per workload: its runs must be of one size
        if len(set(by_run.values())) > 1:
            raise ValueError(f"{w}: the runs measured different request counts ({by_run}); "
                             "pass --runs with runs of one size")
    setups = {w: _setup(w, next(iter(sizes[w].values())), args.profile) for w in measured}
    predicted = {w: _simulated(st) for w, st in setups.items()}
    scaled = {w: {f: _simulated(st, f) for f in args.sensitivity} for w, st in setups.items()}
    lines = [f"| run | workload | {' | '.join(METRICS)} |", "|---" * (2 + len(METRICS)) + "|"]
    lines += [f"| {r['run']} | {r['workload']} | " + " | ".join(f"{r[m]:.4g}" for m in METRICS) + " |" for r in rows]
    summary = {}
    for w, vals in measured.items():
        s = summary[w] = {}
        for m in METRICS:
            xs = [v[m] for v in vals]
            med = statistics.median(xs)
            s[m] = {"runs": len(xs), "min": min(xs), "median": med, "max": max(xs),
                    "predicted": predicted[w][m], "error_vs_median": predicted[w][m] / med - 1}
        lines.append(f"| {len(vals)} runs: min / median / max | {w} | "
                     + " | ".join(f"{s[m]['min']:.4g} / {s[m]['median']:.4g} / {s[m]['max']:.4g}" for m in METRICS) + " |")
        lines.append(f"| {args.profile}: predicted (vs median) | {w} | "
                     + " | ".join(f"{s[m]['predicted']:.4g} ({s[m]['error_vs_median']:+.1%})" for m in METRICS) + " |")
        for f, res in scaled[w].items():
            s[f"steps_x{f:g}"] = {m: res[m] / predicted[w][m] - 1 for m in METRICS}
            lines.append(f"| predicted, every step x{f:g} (vs x1) | {w} | "
                         + " | ".join(f"{res[m]:.4g} ({res[m] / predicted[w][m] - 1:+.1%})" for m in METRICS) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"profile": args.profile, "rows": rows, "summary": summary},
                                                        indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
