"""Sweep speed benchmark (``granisim bench sweep [--out out/bench/sweep_speed.json]``).

1. Single-core simulator speed: the demo scenario (600 requests, Llama-3.1-8B on
   a100-80gb, 4 roles x 16K prefixes), each policy once, in this process: wall seconds,
   simulated seconds per wall second, requests and steps per wall second.
2. A sweep of ``--points`` points (default 1,000) of the demo scenario with
   ``workload.num_requests`` reduced to ``--requests`` (default 200) per point, over
   policy x roles x rate x seed, on ``--workers`` local processes (default: the CPU count),
   into a fresh folder: points per minute end to end (process start-up, validation and
   the results table included).

The machine may be shared: the load average before and after is recorded with the result.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

DEFAULT_OUT = "out/bench/sweep_speed.json"  # outside the tracked tree; --out reports/sim_speed/sweep_speed.json refreshes it
POLICIES = ("granikv", "token")
ROLES = (1, 2, 4, 8, 16)
RATES = (2.0, 3.0, 4.0, 5.0, 6.0)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def single_core() -> dict:
    from granisim.experiments.compare import demo_scenario
    from granisim.experiments.sweep import simulate_scenario

    sc, _ = demo_scenario()
    out = {}
    for pol in ("granikv", "token", "paged16"):
        s = sc.with_changes(**{"policy.name": pol})
        simulate_scenario(s)  # warm caches (cost tables, trace)
        t0 = time.perf_counter()
        summ = simulate_scenario(s)
        wall = time.perf_counter() - t0
        out[pol] = {"requests": summ["requests"], "wall_s": wall, "simulated_s": summ["duration_s"],
                    "sim_speedup_x_realtime": summ["duration_s"] / wall, "requests_per_wall_s": summ["requests"] / wall,
                    "steps": summ["steps"], "plans": summ["plans"], "steps_per_wall_s": summ["steps"] / wall}
    return out


def sweep_points(points: int, requests: int) -> dict:
    seeds = max(1, -(-points // (len(POLICIES) * len(ROLES) * len(RATES))))
    return {"name": "bench_sweep", "base": {"name": "demo", "seed": 0,
                                            "workload": {"kind": "multi_agent", "roles": 4, "prefix_len": 16384,
                                                         "num_requests": requests, "rate": 4.5}},
            "grid": {"policy.name": list(POLICIES), "workload.roles": list(ROLES), "workload.rate": list(RATES),
                     "seed": list(range(seeds))}}


def run(out_json: str = DEFAULT_OUT, points: int = 1000, requests: int = 200,
        workers: int | None = None, ray: str | None = None) -> dict:
    from granisim.experiments.sweep import run_sweep
    from granisim.experiments.sweep_file import sweep_from_dict

    workers = workers or os.cpu_count() or 1
    load0 = os.getloadavg()
    core = single_core()
    t0 = time.perf_counter()
    spec = sweep_from_dict(sweep_points(points, requests), "<bench sweep>")
    spec.points[:] = spec.points[:points]
    with tempfile.TemporaryDirectory() as tmp:
        df = run_sweep(spec, Path(tmp), workers=workers, ray_address=ray)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    result = {
        "benchmark": "granisim sweep speed",
        "command": f"granisim bench sweep --points {points} --requests {requests} --workers {workers}"
                   + (f" --ray {ray}" if ray else ""),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": _git("rev-parse", "--short", "HEAD"),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_before": [round(x, 2) for x in load0], "load_avg_after": [round(x, 2) for x in load1],
                    "note": "shared machine: other engineers' jobs ran at the same time (see load averages)"},
        "single_core_demo": core,
        "sweep": {"points": len(df), "requests_per_point": requests,
                  "reduced_from": "the demo's 600 requests per point to keep the sweep within minutes",
                  "grid": "policy {granikv, token} x roles {1,2,4,8,16} x rate {2..6 req/s} x seeds",
                  "runner": f"ray {ray}" if ray else f"{workers} local processes",
                  "wall_s": wall, "points_per_minute": 60.0 * len(df) / wall,
                  "mean_point_sim_wall_s": float(df.sim_wall_s.mean()),
                  "sum_point_sim_wall_s": float(df.sim_wall_s.sum()),
                  "parallel_efficiency": float(df.sim_wall_s.sum() / (wall * workers)),
                  "all_completed": bool((df.completed == df.requests).all())},
    }
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(result, indent=2))
    print("single core, demo (600 requests): " + ", ".join(
        f"{p} {v['wall_s']:.2f} s wall ({v['sim_speedup_x_realtime']:.0f}x real time)" for p, v in core.items()))
    s = result["sweep"]
    print(f"sweep: {s['points']} points x {requests} requests in {s['wall_s']:.0f} s on {s['runner']}: "
          f"{s['points_per_minute']:.0f} points/min (load avg {load0[0]:.2f} -> {load1[0]:.2f})")
    print(f"wrote {out_json}")
    return result
