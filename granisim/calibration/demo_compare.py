"""The demo scenario (granisim demo) on H200: the extrapolated profile vs the measured one.

    .venv/bin/python scripts/calibration_demo_compare.py [--requests N]

Runs the three demo policies with hardware.profile = calibration/profiles/h200-extrapolated.json
(the what-if profile shipped before calibration) and = granisim/config/profiles/h200.json (measured),
writes reports/calibration/demo/{extrapolated,measured}.{json,txt} and compare.json (+ the step-time
breakdowns per policy, mean per step).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import pandas as pd

from granisim.experiments.compare import DEMO_POLICIES, compare, demo_scenario, summary_table

PROFILES = {"extrapolated": str(ROOT / "calibration" / "profiles" / "h200-extrapolated.json"),
            "measured": str(ROOT / "granisim" / "config" / "profiles" / "h200.json")}
KEYS = ("throughput_rps", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "completed",
        "mean_batch", "preemptions")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=0, help="requests per run (0: the demo's own)")
    ap.add_argument("--rate", type=float, default=0.0, help="arrival rate, req/s (0: the demo's own)")
    args = ap.parse_args()
    scenario, source = demo_scenario()
    out = ROOT / "reports" / "calibration" / ("demo" if not args.rate else f"demo_rate{args.rate:g}")
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for name, prof in PROFILES.items():
        sc = scenario.with_changes(**{"hardware.profile": prof})
        if args.requests:
            sc = sc.with_changes(**{"workload.num_requests": args.requests})
        if args.rate:
            sc = sc.with_changes(**{"workload.rate": args.rate})
        with tempfile.TemporaryDirectory() as tmp:
            summaries = compare(sc, source, DEMO_POLICIES.split(","), Path(tmp), progress=False)
            steps = {}
            for pol in summaries:
                st = pd.read_parquet(Path(tmp) / pol / "steps.parquet")
                cols = [c for c in st.columns if c.startswith("t_") or c in ("duration_s",)]
                n = float(st["num_steps"].sum())  # fast-forwarded rows cover several steps
                steps[pol] = {c: float(st[c].sum()) / n for c in cols} | {"steps": n}
        table = summary_table(summaries)
        print(f"== h200 {name}\n{table}\n")
        (out / f"{name}.txt").write_text(table + "\n")
        result[name] = {pol: {k: s.get(k) for k in KEYS} | {"step_means": steps[pol]} for pol, s in summaries.items()}
        result[name]["kv_budget_tokens"] = next(iter(summaries.values())).get("kv_budget_tokens")
    (out / "compare.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    e, m = result["extrapolated"], result["measured"]
    for pol in DEMO_POLICIES.split(","):
        print(f"{pol:8s} throughput {e[pol]['throughput_rps']:.3f} -> {m[pol]['throughput_rps']:.3f} req/s; "
              f"TPOT p50 {e[pol]['tpot_p50_s'] * 1e3:.1f} -> {m[pol]['tpot_p50_s'] * 1e3:.1f} ms; "
              f"TTFT p50 {e[pol]['ttft_p50_s']:.3f} -> {m[pol]['ttft_p50_s']:.3f} s")


if __name__ == "__main__":
    main()
