"""Run-to-run table: the end-to-end metrics measured in several validation runs beside one prediction.

    python scripts/validation_runs.py reports/validation --profile h200-engine --out reports/validation/runs

Reads every ``RUN/validation_<workload>.json`` under the given folders (as written by
``scripts/engine_h200.py validate``; variants such as ``_gc`` are rows of their own), and prices
each workload once with the simulator alone under ``--profile``. Shows how far apart the real
engine's own runs are, so a prediction error can be set against that spread. No GPU needed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from engine_h200 import VALIDATION  # noqa: E402
from granisim.metrics import requests_frame, summarize  # noqa: E402
from granisim.simulate import simulate  # noqa: E402
from validation_report import _setup  # noqa: E402

METRICS = ("throughput_rps", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


def _runs(root: Path) -> dict[str, Path]:
    """Run folder name -> folder holding its validation_*.json (the run itself or its h200_run/)."""
    found = {}
    for js in sorted(root.rglob("validation_*.json")):
        found.setdefault(str(js.parent.relative_to(root)), js.parent)
    return found


def _simulated(setup) -> dict:
    res = simulate(setup, progress=False)
    return summarize(requests_frame(res.records), res.steps.frame(), res.end_s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows, measured = [], {}
    for run, folder in _runs(args.root).items():
        for js in sorted(folder.glob("validation_*.json")):
            name = js.stem[len("validation_"):]
            base = next((w for w in VALIDATION if name == w or name.startswith(w + "_")), None)
            if base is None:
                continue
            e2e = json.loads(js.read_text())["end_to_end"]
            vals = {m: e2e[m]["measured"] for m in METRICS}
            rows.append({"run": run, "workload": name, **vals})
            measured.setdefault(base, []).append(vals)
    predicted = {w: _simulated(_setup(w, args.requests, args.profile)) for w in measured}
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"profile": args.profile, "rows": rows, "summary": summary},
                                                        indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
