"""The host work of the real engine's decode step, on this machine's CPU: building its metadata (`rows.build`,
against the per-request construction it replaced, `rows_reference.build_reference`) and uploading it
(`metadata.upload` into a `MetaArena`: pinned staging and host-to-device copies on a GPU, plain copies on a CPU).

    .venv/bin/python -m gpu_backend.bench.host_work [--out out/host_work] [--policies granikv token paged16]
        [--workload burst|paper] [--lp 16384] [--k 4] [--requests 64] [--min-batch 32] [--device cpu|cuda]

The plans are the engine's own, run through the real scheduler and allocator with each step priced by the cost
model: the speedup unit's burst (`--workload burst`, `granisim validation gpu-run speedup`: `requests` requests over
`k` roles' `lp`-token prefixes on Llama-3.1-8B, `h200-engine`), whose decode-only steps with the whole burst decoding
are timed (B = `requests`), or the paper's setting (`--workload paper`, `granisim validation gpu-run paper` at `lp`:
Poisson arrivals near saturation, requests joining and leaving the batch), whose decode-only steps of at least
`--min-batch` requests are timed. Each plan is timed `--repeat` times over `--number` calls; per plan the median,
then the median and range over the plans; then every plan of the run in order through the engine's request table
(how many of the timed steps repeat the previous one, `rows_repeat.py`, is counted). No GPU needed (`--device
cuda` times the upload through pinned memory as the engine does, host time only). Prints a table; writes
OUT/host_work.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def burst_plans(policy: str, lp: int, k: int, requests: int, profile: str = "h200-engine"):
    """(every plan of the speedup unit's burst as the engine would get them, KV slots of the engine's budget)."""
    from granisim.validation.gpu_runs import burst_scenario

    return engine_plans(burst_scenario(policy, lp, k, requests, profile))


def paper_plans(policy: str, lp: int, profile: str = "h200-engine"):
    """(every plan of the paper-setting unit at `lp` as the engine would get them, KV slots of the engine's budget)."""
    from granisim.validation.gpu_runs import paper_scenario

    return engine_plans(paper_scenario(policy, lp, profile))


def engine_plans(scenario):
    """(every plan of `scenario` served by the real scheduler and allocator, each step priced by the cost model, as
    the engine would get them; KV slots of the engine's budget)."""
    from granisim.core.serving_loop import ServingLoop
    from granisim.costmodel.executor import for_setup
    from granisim.experiments.run import prepare

    setup = prepare(scenario)
    cost = for_setup(setup)

    class Recorder:  # the engine's protocol (one step a plan, layouts), the cost model's prices
        needs_layouts = True
        max_steps_per_plan = 1

        def __init__(self):
            self.plans = []

        def execute(self, plan):
            self.plans.append(plan)
            return cost.execute(plan)

    rec = Recorder()
    ServingLoop(setup, rec, progress=False).run()
    return rec.plans, setup.kv_budget


def _per_call_us(fn, number: int, repeat: int) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def measure(policy: str, args) -> dict:
    import torch

    from gpu_backend.executor import metadata, rows
    from gpu_backend.executor.arena import MetaArena
    from gpu_backend.executor.rows_reference import build_reference

    if args.workload == "burst":
        plans, num_slots = burst_plans(policy, args.lp, args.k, args.requests)
        least = args.requests
    else:
        plans, num_slots = paper_plans(policy, args.lp)
        least = args.min_batch
    decode = [p for p in plans if len(p.requests) >= least and not any(r.is_prefill for r in p.requests)]
    full = decode[:: max(1, len(decode) // args.plans)][: args.plans]
    arena = MetaArena(torch.device(args.device))
    old, new, up = [], [], []
    for plan in full:
        host = rows.build(plan, num_slots)
        if not arena.fits(host):
            arena.reserve(host)
        old.append(_per_call_us(lambda: build_reference(plan, num_slots), args.number, args.repeat))
        new.append(_per_call_us(lambda: rows.build(plan, num_slots), args.number, args.repeat))
        up.append(_per_call_us(lambda: metadata.upload(host, arena), args.number, args.repeat))
    if args.device == "cuda":
        torch.cuda.synchronize()
    host = rows.build(full[0], num_slots)
    in_order = {kind: _in_order(plans, set(map(id, decode)), num_slots, args, kind == "table")
                for kind in ("listed", "table")}
    lb, lu, _, _ = in_order["listed"]
    tb, tu, _, repeated = in_order["table"]
    return {"policy": policy, "workload": args.workload, "batch": least, "plans": len(full), "decode_plans": len(plans),
            "ids_uploaded": _ids(host), "build_reference_us": _spread(old), "build_us": _spread(new),
            "upload_us": _spread(up), "build_speedup": _spread([o / n for o, n in zip(old, new)]),
            "in_order": {kind: {"build_us": _spread(b), "upload_us": _spread(u), "ids_uploaded": _spread(i)}
                         for kind, (b, u, i, _) in in_order.items()},
            "in_order_steps": len(lb), "repeated_steps": repeated,
            "table_speedup": _spread([(b + u) / (c + v) for b, u, c, v in zip(lb, lu, tb, tu)])}


def _ids(host) -> int:
    return int(sum(a.size for a in host.small) + sum(a.size for a in host.big.values()))


def _in_order(plans, timed: set, num_slots: int, args, table: bool) -> tuple[list, list, list, int]:
    """Build and upload every plan of the run in order, once each, as the engine serves them: ids listed afresh each
    step, or (`table`) with the engine's request table (request_table.py: a row is written whole once, then
    extended); `--repeat` times over afresh. Per timed plan the median of its build and of its upload (the rows it
    writes whole included), in us, and the ids it uploads; and how many timed plans repeated the previous one."""
    import torch

    from gpu_backend.executor import metadata, rows
    from gpu_backend.executor.arena import MetaArena
    from gpu_backend.executor.request_table import RequestTable

    runs, repeated = [], 0
    for r in range(args.repeat):
        tab, arena, times = RequestTable() if table else None, MetaArena(torch.device(args.device)), []
        for plan in plans:
            t0 = time.perf_counter()
            host = rows.build(plan, num_slots, table=tab)
            t1 = time.perf_counter()
            if not arena.fits(host):
                arena.reserve(host)
            t2 = time.perf_counter()
            metadata.upload(host, arena)
            if args.device == "cuda":
                torch.cuda.synchronize()  # the step's own sync: the next build may not overwrite staged ids in flight
            t3 = time.perf_counter()
            if id(plan) in timed:
                times.append(((t1 - t0) * 1e6, (t3 - t2) * 1e6, _ids(host)))
                repeated += r == 0 and tab is not None and tab.repeat is not None and tab.repeat.host is host
        runs.append(times)
    per_plan = list(zip(*runs))
    return ([statistics.median(t[0] for t in p) for p in per_plan],
            [statistics.median(t[1] for t in p) for p in per_plan], [p[0][2] for p in per_plan], repeated)


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def code_commit() -> str | None:
    """The code's commit: a COMMIT file at the tree's root (a copy made by `git archive`), else git's HEAD."""
    if (ROOT / "COMMIT").is_file():
        return (ROOT / "COMMIT").read_text().strip()
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gpu_backend.bench.host_work", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/host_work"))
    ap.add_argument("--policies", nargs="+", default=["granikv", "token", "paged16"])
    ap.add_argument("--lp", type=int, default=16384)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--requests", type=int, default=64, help="the burst's requests (--workload burst)")
    ap.add_argument("--workload", default="burst", choices=["burst", "paper"])
    ap.add_argument("--min-batch", type=int, default=32, help="decode steps of at least this many requests are timed "
                    "(--workload paper)")
    ap.add_argument("--plans", type=int, default=8, help="decode plans of the full batch timed (spread over the run)")
    ap.add_argument("--number", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args(argv)
    rows = [measure(p, args) for p in args.policies]
    import numpy as np
    import torch

    meta = {"cpu": _cpu(), "cores": os.cpu_count(), "python": sys.version.split()[0], "numpy": np.__version__,
            "torch": torch.__version__, "device": args.device, "commit": code_commit(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    what = (f"the burst, B = {args.requests}, {args.k} roles" if args.workload == "burst"
            else f"the paper's setting, B >= {args.min_batch}")
    print(f"host work of a decode step, {what} x {args.lp} tokens ({meta['cpu']}); us per call, median over plans "
          f"(min-max)")
    f = lambda s: f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"  # noqa: E731
    print(f"{'policy':8} {'plans':>5} {'ids':>8} {'build before':>20} {'build now':>20} {'speedup':>8} "
          f"{'upload (' + args.device + ')':>20}")
    for r in rows:
        print(f"{r['policy']:8} {r['plans']:5d} {r['ids_uploaded']:8d} {f(r['build_reference_us']):>20} "
              f"{f(r['build_us']):>20} {r['build_speedup']['median']:7.2f}x {f(r['upload_us']):>20}")
    print("every plan of the run built and uploaded once, in order (as the engine serves them): ids listed afresh "
          "each step, or through the request table")
    print(f"{'policy':8} {'ids, listed':>11} {'build':>16} {'upload':>16} {'ids, table':>10} {'build':>16} "
          f"{'upload':>16} {'host part':>9} {'repeating':>9}")
    for r in rows:
        a, t = r["in_order"]["listed"], r["in_order"]["table"]
        print(f"{r['policy']:8} {a['ids_uploaded']['median']:11.0f} {f(a['build_us']):>16} {f(a['upload_us']):>16} "
              f"{t['ids_uploaded']['median']:10.0f} {f(t['build_us']):>16} {f(t['upload_us']):>16} "
              f"{r['table_speedup']['median']:8.2f}x {r['repeated_steps']:4d}/{r['in_order_steps']:<4d}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_work.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {args.out / 'host_work.json'}")


if __name__ == "__main__":
    main()
