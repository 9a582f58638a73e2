"""Simulator speed: replay the full Azure conversation trace (19,366 requests, ~1 h of arrivals)
on Llama-3.1-8B / a100-80gb and report wall time, speed vs real time and peak memory.

    python -m granisim.experiments.bench_sim [--policy granikv] [--repeats 3] [--out out/bench/sim_speed.json]

Target (issue 3): >= 1,000x faster than real time on one core (under ~4 s) and < 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = "out/bench/sim_speed.json"  # outside the tracked tree; --out reports/sim_speed.json refreshes it

from granisim.core.serving_loop import ServingLoop
from granisim.costmodel.executor import CostExecutor
from granisim.config.scenario import load_scenario
from granisim.experiments.run import prepare


def _commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except Exception:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="granikv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON report to write (default {DEFAULT_OUT})")
    args = ap.parse_args()
    sc = load_scenario(ROOT / "scenarios" / "azure_replay.toml").with_changes(**{"policy.name": args.policy})
    setup = prepare(sc)
    walls, result = [], None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        result = ServingLoop(setup, CostExecutor(setup.profile, setup.model), progress=False).run()
        walls.append(time.perf_counter() - t0)
    steps = result.steps.frame()
    sim_s = result.end_s
    best, med = min(walls), sorted(walls)[len(walls) // 2]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(["python"] + sys.argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m": os.getloadavg()[0]},
        "scenario": "scenarios/azure_replay.toml", "policy": args.policy,
        "requests": len(result.records), "simulated_s": sim_s,
        "decode_steps": int(steps.num_steps.sum()), "plans": len(steps),
        "wall_s": walls, "wall_s_median": med, "wall_s_best": best,
        "speed_vs_real_time_median": sim_s / med, "peak_rss_mb": rss_mb,
        "target": ">= 1000x real time (< ~3.5 s wall) and < 1024 MB",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'requests':>10} {'sim time':>10} {'steps':>8} {'plans':>7} {'wall med':>9} {'wall best':>9} "
          f"{'x real':>8} {'peak RSS':>9}")
    print(f"{report['requests']:>10} {sim_s:>9.0f}s {report['decode_steps']:>8} {report['plans']:>7} {med:>8.2f}s "
          f"{best:>8.2f}s {sim_s / med:>7.0f}x {rss_mb:>7.0f}MB")
    print(f"repeats: {args.repeats}, walls: {', '.join(f'{w:.2f}' for w in walls)}; wrote {args.out}")


if __name__ == "__main__":
    main()
