"""Simulator speed: CPU time, wall time, speed vs real time and memory of whole simulations.

    granisim bench sim [--out out/bench/sim_speed.json]
    python -m granisim.experiments.bench_sim [--cases azure_replay,multi_agent_saturated] [--repeats 3]
                                             [--policy granikv] [--out out/bench/sim_speed.json]
    python -m granisim.experiments.bench_sim --fleet [--router cache_aware]   # the fleet series alone

Cases (Llama-3.1-8B on a100-80gb, cost-model executor):

* ``azure_replay`` — azure_replay.toml: the Azure conversation trace (19,366
  requests, ~1 h of arrivals) at its own timestamps.
* ``azure_replay_half`` — its first 9,683 requests (~30 min): with ``azure_replay``, the memory
  one more request costs (the difference of the two over the difference in requests), apart
  from what a run needs whatever its length (the KV allocator, the radix index filling the
  cache, the first string column's allocator pages).
* ``azure_replay_x4``, ``azure_replay_x16`` — the trace 4 or 16 times back to back (4 h, 16 h):
  memory per request, and how the cost per plan grows with the length of a run.
* ``multi_agent_saturated`` — multi_agent_16k.toml (4 roles, 16K-token shared
  prompts) with 1,200 requests arriving at 12/s, twice what one GPU serves: a long queue.
* ``fleet_N`` (N = 1, 4, 16, 64) — N replicas behind the round-robin router (``--router
  cache_aware``: SGLang's), fed N copies of the trace compressed N-fold in time (each replica
  sees the trace's load). ``--fleet`` runs this series alone.

The cases' scenario files ship with the package (granisim/config/scenarios/, copies of scenarios/*.toml),
so the benchmark runs from an installed granisim as from a checkout.

Each run is a fresh subprocess, so peak RSS (``ru_maxrss``) is that run's own. CPU time is
``time.process_time()`` around the simulation; speed vs real time = simulated seconds / CPU
seconds; bytes per request = (peak RSS - RSS before the simulation) / requests, the
simulation's frames included. The table and JSON give the median of ``--repeats`` runs
(by CPU time). Pin it to one core for comparable figures: ``taskset -c 0 granisim bench sim``.
``--baseline DIR`` also times another checkout's code (``git worktree add DIR COMMIT``), its runs
alternating with this one's so that both see the same machine load, and reports the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when run from one (its commit goes in the report)
# The cases' scenarios: package data (pyproject.toml), byte-identical copies of scenarios/*.toml (a test keeps them
# so), not the checkout's scenarios/ folder, which an installed granisim does not have.
SCENARIOS = "granisim.config.scenarios"
DEFAULT_OUT = "out/bench/sim_speed.json"  # outside the tracked tree; reports/sim_speed/ quotes its figures


@dataclasses.dataclass(frozen=True)
class Case:
    scenario: str
    changes: tuple[tuple[str, object], ...] = ()
    copies: int = 1  # the trace repeated back to back this many times
    replicas: int = 0  # 0: the single serving loop; N: a fleet of N replicas


CASES = {
    "azure_replay": Case("azure_replay.toml"),
    "azure_replay_half": Case("azure_replay.toml", (("workload.num_requests", 9683),)),
    "azure_replay_x4": Case("azure_replay.toml", copies=4),
    "azure_replay_x16": Case("azure_replay.toml", copies=16),
    "multi_agent_saturated": Case("multi_agent_16k.toml", (("workload.rate", 12.0), ("workload.num_requests", 1200))),
    **{f"fleet_{n}": Case("azure_replay.toml", (("workload.time_scale", float(n)),), copies=n, replicas=n)
       for n in (1, 4, 16, 64)},
}
DEFAULT_CASES = ("azure_replay", "multi_agent_saturated", "azure_replay_x16", "fleet_1", "fleet_4", "fleet_16",
                 "fleet_64")
FLEET_CASES = ("fleet_1", "fleet_4", "fleet_16", "fleet_64")  # --fleet: the scaling series alone
FLEET_ROUTERS = ("round_robin", "cache_aware")


def repeat_trace(trace, copies: int):
    """``copies`` of the trace back to back, each starting one mean gap after the previous ends."""
    import pandas as pd

    if copies == 1:
        return trace
    t = trace["arrived_at"].to_numpy()
    period = (t[-1] - t[0]) * len(t) / max(1, len(t) - 1)
    parts = [trace.assign(arrived_at=trace["arrived_at"] + k * period) for k in range(copies)]
    return pd.concat(parts, ignore_index=True)


def load_case_scenario(name: str):
    """A case's scenario file (``Case.scenario``), from the package's scenarios."""
    from granisim.config.scenario import load_scenario

    with resources.as_file(resources.files(SCENARIOS).joinpath(name)) as path:
        return load_scenario(path)


def _rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the high-water mark so far
        return _peak_rss()


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def measure(name: str, policy: str, router: str = "round_robin") -> dict:
    """Run one case in this process (call it in a fresh one) and return its figures."""
    from granisim.config.scenario import parse_scenario
    from granisim.core.metrics import requests_frame
    from granisim.experiments.run import prepare, simulate

    case = CASES[name]
    sc = load_case_scenario(case.scenario).with_changes(**{"policy.name": policy, **dict(case.changes)})
    if case.replicas:
        data = sc.model_dump()
        data["fleet"] = {"replicas": case.replicas, "router": router}
        sc = parse_scenario(data, source=f"bench case {name}")
    setup = prepare(sc)
    setup = dataclasses.replace(setup, trace=repeat_trace(setup.trace, case.copies))
    rss0 = _rss_now()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = simulate(setup, progress=False)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    steps = result.steps.frame()
    n = len(requests_frame(result.records))
    peak = _peak_rss()
    return {"case": name, **({"router": router} if case.replicas else {}), "requests": n, "simulated_s": result.end_s, "plans": len(steps),
            "steps": int(steps.num_steps.sum()), "cpu_s": cpu, "wall_s": wall, "speed_x_real_time": result.end_s / cpu,
            "peak_rss_mb": peak / 2**20, "bytes_per_request": (peak - rss0) / max(1, n)}


def _run_child(name: str, policy: str, router: str = "round_robin", code: str | Path | None = None) -> dict:
    """One measurement in a fresh process; ``code``: run another checkout's granisim instead (its
    folder first on PYTHONPATH, the scenarios of its own package, or of its scenarios/ before they shipped)."""
    cmd = [sys.executable, "-m", "granisim.experiments.bench_sim", "--child", name, "--policy", policy,
           "--router", router]
    env = None
    if code is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=code).stdout
    got = json.loads(out.strip().splitlines()[-1])
    got["load_avg_1m"] = load  # when the run started
    return got


def _median_row(got: list[dict]) -> dict:
    got = sorted(got, key=lambda r: r["cpu_s"])
    med = dict(got[len(got) // 2])
    med["cpu_s_runs"] = [r["cpu_s"] for r in got]
    med["load_avg_1m_runs"] = [r["load_avg_1m"] for r in got]
    med["wall_s"] = statistics.median(r["wall_s"] for r in got)
    return med


def _commit(where: str | Path = ROOT) -> str:
    if not (Path(where) / ".git").exists():  # an installed granisim: not the commit of a repository around it
        return "unknown"
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=where, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':<30} {'requests':>9} {'sim time':>9} {'plans':>8} {'CPU s':>8} {'wall s':>8} "
            f"{'x real':>7} {'peak RSS':>9} {'B/request':>10}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['case']:<30} {r['requests']:>9} {r['simulated_s']:>8.0f}s {r['plans']:>8} "
                     f"{r['cpu_s']:>8.2f} {r['wall_s']:>8.2f} {r['speed_x_real_time']:>6.0f}x "
                     f"{r['peak_rss_mb']:>7.0f}MB {r['bytes_per_request']:>10.0f}")
    return "\n".join(lines)


def run(out: str | Path = DEFAULT_OUT, cases=DEFAULT_CASES, repeats: int = 3, policy: str = "granikv",
        router: str = "round_robin", baseline: str | Path | None = None) -> dict:
    """``baseline``: also measure that checkout's code, alternating its runs with this one's (both see
    the same machine load); its rows are named ``CASE@baseline`` and each case gets a speedup."""
    rows, base_rows, speedups = [], [], {}
    for name in cases:
        got, base = [], []
        for _ in range(repeats):
            if baseline is not None:
                base.append(_run_child(name, policy, router, baseline))
            got.append(_run_child(name, policy, router))
        med = _median_row(got)
        if baseline is not None:
            b = _median_row(base)
            b["case"] = f"{name}@baseline"
            base_rows.append(b)
            speedups[name] = {"cpu_s_ratio": b["cpu_s"] / med["cpu_s"],
                              "peak_rss_ratio": b["peak_rss_mb"] / med["peak_rss_mb"],
                              "same_plans": b["plans"] == med["plans"] and b["steps"] == med["steps"]}
            print(format_table([b]).splitlines()[-1], flush=True)
        rows.append(med)
        print(format_table([med]).splitlines()[-1], flush=True)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(["python"] + sys.argv),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "affinity": affinity,
                    "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
        "policy": policy, "router": router, "repeats": repeats, "cases": rows,
        **({"baseline": {"code": str(baseline), "commit": _commit(baseline), "cases": base_rows,
                         "speedup": speedups}} if baseline is not None else {}),
        "goal": ">= 1000x real time on one core and <= 1 KB per request (1-hour replay: <= 3.5 s CPU)",
    }
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table([*base_rows, *rows]))
    for name, sp in speedups.items():
        print(f"{name}: baseline / this CPU time {sp['cpu_s_ratio']:.2f}x, peak RSS {sp['peak_rss_ratio']:.2f}x, "
              f"same plans and steps: {sp['same_plans']}")
    print(f"median of {repeats} runs per case (by CPU time); wrote {path}")
    return report


def _policy_error(cases: list[str], policy: str) -> str | None:
    """Why ``policy`` cannot run these cases (checked before any is timed), or None."""
    from granisim.config.scenario import ScenarioError

    for scenario in sorted({CASES[c].scenario for c in cases}):
        try:
            load_case_scenario(scenario).with_changes(**{"policy.name": policy})
        except ScenarioError as err:
            return str(err)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", default="granikv")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON report to write (default {DEFAULT_OUT})")
    ap.add_argument("--fleet", action="store_true", help=f"the fleet scaling series only: {', '.join(FLEET_CASES)}")
    ap.add_argument("--router", default="round_robin", help=f"fleet cases' router: {', '.join(FLEET_ROUTERS)}")
    ap.add_argument("--baseline", metavar="DIR", help="also time the granisim of this checkout (e.g. a git "
                    "worktree of an older commit), alternating its runs with this one's")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one measurement in this (fresh) process
    args = ap.parse_args(argv)
    if args.router not in FLEET_ROUTERS:
        print(f"bench sim: --router: unknown router {args.router!r} (known: {', '.join(FLEET_ROUTERS)})",
              file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(measure(args.child, args.policy, args.router)))
        return 0
    cases = list(FLEET_CASES) if args.fleet else [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or args.repeats < 1:
        bad = f"--cases: unknown case {unknown[0]!r} (known: {', '.join(CASES)})" if unknown else \
            f"--repeats: must be >= 1, got {args.repeats}"
        print(f"bench sim: {bad}", file=sys.stderr)
        return 2
    if Path(args.out).is_dir():
        print(f"bench sim: --out: {args.out!r} is a folder; give the JSON file to write", file=sys.stderr)
        return 2
    bad_policy = _policy_error(cases, args.policy)
    if bad_policy:
        print(f"bench sim: --policy: {bad_policy}", file=sys.stderr)
        return 2
    if args.baseline is not None and not (Path(args.baseline) / "granisim" / "experiments" / "bench_sim.py").is_file():
        print(f"bench sim: --baseline: {args.baseline!r} holds no granisim/experiments/bench_sim.py", file=sys.stderr)
        return 2
    extra = {"baseline": args.baseline} if args.baseline is not None else {}
    run(args.out, cases, args.repeats, args.policy, args.router, **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
