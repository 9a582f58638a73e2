"""Allocator micro-benchmark: COLD bulk throughput, HOT slab latency, radix match, policy cycles.

``python -m granisim.experiments.bench_alloc [--repeats N] [--out out/bench/alloc.json]`` prints a table and
writes JSON (date, machine, versions, git commit, command). Every figure is the median over
``repeats`` independent repeats (each repeat's own figure is a median over many operations,
or a throughput over a batch), with the min/max and p10/p90 across repeats as its spread.
Timing uses ``time.perf_counter_ns``. Targets (issue 2, on a 2-core CPU machine):
COLD bulk allocate+free >= 2M tokens/s; HOT slab allocate and free <= 10 us each;
radix match of a 16K-token prefix among 64 cached 16K prefixes <= 50 us.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns

import numpy as np

from granisim.kv import ColdPool, HotPool, RadixIndex, make_allocator

TARGETS = {  # metric -> (direction, bound)
    "cold_alloc_free_256": (">=", 2e6),
    "cold_alloc_free_4096": (">=", 2e6),
    "hot_allocate": ("<=", 10.0),
    "hot_release": ("<=", 10.0),
    "radix_match_disjoint": ("<=", 50.0),
    "radix_match_common_start": ("<=", 50.0),
}
SEED = 20261129
DEFAULT_OUT = "out/bench/alloc.json"  # outside the tracked tree; reports/sim_speed/alloc.json is refreshed with --out


# ---- measurement helpers ----------------------------------------------------------------------
def _summary(values: list[float], unit: str, what: str) -> dict:
    v = np.asarray(values, dtype=float)
    return dict(what=what, unit=unit, median=float(np.median(v)), min=float(v.min()), max=float(v.max()),
                p10=float(np.percentile(v, 10)), p90=float(np.percentile(v, 90)), repeats=int(v.size))


def _per_op_us(fn: Callable[[], object], n: int) -> float:
    """Median latency of ``n`` individually timed calls, in microseconds."""
    out = np.empty(n, np.int64)
    for i in range(n):
        t0 = perf_counter_ns()
        fn()
        out[i] = perf_counter_ns() - t0
    return float(np.median(out)) / 1e3


# ---- COLD ----------------------------------------------------------------------------------------
def bench_cold(batch: int, repeats: int, capacity: int = 1 << 20, batches: int = 64) -> dict:
    """Tokens/s for allocating ``batches`` bulk batches and freeing them in shuffled order,
    on a pool that is already half full (freed slots come back scattered)."""
    rng = np.random.default_rng(SEED)
    pool = ColdPool(capacity)
    held = pool.allocate(capacity // 2)
    pool.free_slots(rng.permutation(held)[: capacity // 4])  # scatter the free list
    rates = []
    for _ in range(repeats + 1):
        order = rng.permutation(batches)
        t0 = perf_counter_ns()
        got = [pool.allocate(batch) for _ in range(batches)]
        for i in order:
            pool.free_slots(got[i])
        dt = perf_counter_ns() - t0
        rates.append(batch * batches / (dt / 1e9))
    return _summary(rates[1:], "tokens/s", f"COLD allocate+free, batches of {batch} tokens ({batches} per repeat)")


# ---- HOT -----------------------------------------------------------------------------------------
def bench_hot(repeats: int, live: int = 64, ops: int = 400) -> tuple[dict, dict]:
    """Steady-state churn with ``live`` slabs of 256..4096 slots: release a random live slab,
    allocate a new one; each call timed alone."""
    rng = np.random.default_rng(SEED + 1)
    pool = HotPool(live * 4096)
    slabs = [pool.allocate(int(n)) for n in rng.integers(256, 4097, live)]
    for _ in range(4 * live):  # warm up into a fragmented steady state
        pool.release(slabs.pop(int(rng.integers(len(slabs)))))
        s = pool.allocate(int(rng.integers(256, 4097)))
        slabs.append(s if s is not None else pool.allocate(256))
    alloc_us, free_us = [], []
    for _ in range(repeats):
        a_t = np.empty(ops, np.int64)
        f_t = np.empty(ops, np.int64)
        victims = rng.integers(0, live, ops)
        sizes = rng.integers(256, 4097, ops)
        for k in range(ops):
            victim = slabs.pop(int(victims[k]) % len(slabs))
            t0 = perf_counter_ns()
            pool.release(victim)
            t1 = perf_counter_ns()
            s = pool.allocate(int(sizes[k]))
            t2 = perf_counter_ns()
            if s is None:  # no run long enough: a small one always fits after a release
                s = pool.allocate(256)
            slabs.append(s)
            f_t[k], a_t[k] = t1 - t0, t2 - t1
        alloc_us.append(float(np.median(a_t)) / 1e3)
        free_us.append(float(np.median(f_t)) / 1e3)
    extra = f" ({live} live slabs of 256..4096 slots, {len(pool.free_ranges())} free runs at the end)"
    return (_summary(alloc_us, "us", "HOT slab allocate (best fit)" + extra),
            _summary(free_us, "us", "HOT slab release (coalescing)" + extra))


# ---- radix ---------------------------------------------------------------------------------------
def bench_radix(repeats: int, common: int, n_prefixes: int = 64, length: int = 16384, ops: int = 128) -> dict:
    """Match a cached 16K prefix (plus a 256-token new suffix) among ``n_prefixes`` cached ones.
    ``common`` leading tokens are shared by all prefixes (0 = they share nothing)."""
    rng = np.random.default_rng(SEED + 2 + common)
    r = RadixIndex()
    start = rng.integers(0, 32000, common)
    prefixes = [np.concatenate([start, rng.integers(0, 32000, length - common)]) for _ in range(n_prefixes)]
    slot = 0
    for p in prefixes:
        r.insert(p, np.arange(slot, slot + length), "cold")
        slot += length
    queries = [np.concatenate([p, rng.integers(0, 32000, 256)]) for p in prefixes]
    for q in queries:  # any node split happens here, not in the timed loop
        assert r.match_prefix(q).length == length
    lat = []
    for _ in range(repeats):
        it = iter(range(10**9))
        lat.append(_per_op_us(lambda: r.match_prefix(queries[next(it) % n_prefixes]), ops))
    desc = "nothing" if common == 0 else f"a common {common}-token start"
    return _summary(lat, "us", f"radix match of a 16K prefix (+256 new) among {n_prefixes} cached 16K prefixes "
                               f"sharing {desc}")


# ---- allocator policy cycle -------------------------------------------------------------------------
def bench_cycle(policy: str, repeats: int, requests: int = 200, agents: int = 8, prompt_shared: int = 2048,
                suffix: int = 512, decode: int = 32, live: int = 16) -> dict:
    """Per request: admit (match + lock, HOT slab for the declared prefix), prefill extend,
    cache_prefix, ``decode`` one-token extends, release (cache). ``live`` requests overlap."""
    rng = np.random.default_rng(SEED + 3)
    cap = 1 << 20
    agent_prompts = [rng.integers(0, 32000, prompt_shared) for _ in range(agents)]
    phases = {k: [] for k in ("admit", "prefill", "decode_token", "release", "cycle")}
    for _ in range(repeats):
        a = make_allocator(policy, cap, hot_fraction=0.25)
        pending: list[tuple[int, np.ndarray]] = []
        t = {k: np.zeros(requests, np.int64) for k in phases}
        for rid in range(requests):
            prompt = np.concatenate([agent_prompts[rid % agents], rng.integers(0, 32000, suffix)])
            tokens = np.concatenate([prompt, rng.integers(0, 32000, decode)])
            t0 = perf_counter_ns()
            cached = a.admit(rid, prompt, prompt_shared)
            t1 = perf_counter_ns()
            a.extend(rid, prompt.size - cached)
            a.cache_prefix(rid, prompt[:prompt_shared])
            t2 = perf_counter_ns()
            for _ in range(decode):
                a.extend(rid, 1)
            t3 = perf_counter_ns()
            pending.append((rid, tokens))
            t4 = t5 = t3
            if len(pending) > live:
                old, old_tokens = pending.pop(0)
                t4 = perf_counter_ns()
                a.release(old, old_tokens)
                t5 = perf_counter_ns()
            t["admit"][rid], t["prefill"][rid] = t1 - t0, t2 - t1
            t["decode_token"][rid] = (t3 - t2) // decode
            t["release"][rid] = t5 - t4
            t["cycle"][rid] = (t1 - t0) + (t3 - t1) + (t5 - t4)
        for rid, tokens in pending:
            a.release(rid, tokens)
        done = requests - live  # requests whose release was timed
        for k in phases:
            v = t[k][:done] if k in ("release", "cycle") else t[k]
            phases[k].append(float(np.median(v[agents:])) / 1e3)  # after the first request per agent
    st = a.stats()
    out = {k: _summary(v, "us", f"{policy}: {k}") for k, v in phases.items()}
    out["hit_rate"] = st.hit_rate
    out["what"] = (f"{policy}: admit + prefill extend ({prompt_shared} declared shared + {suffix} own tokens) + "
                   f"cache_prefix + {decode} one-token extends + release, {live} live requests, {agents} agents")
    return out


# ---- driver --------------------------------------------------------------------------------------
def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "granisim/kv", "granisim/experiments/bench_alloc.py"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        return sha.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _fmt(s: dict) -> tuple[str, str]:
    if s["unit"] == "tokens/s":
        return f"{s['median'] / 1e6:.2f} M/s", f"{s['min'] / 1e6:.2f}..{s['max'] / 1e6:.2f}"
    return f"{s['median']:.2f} us", f"{s['min']:.2f}..{s['max']:.2f}"


def _verdict(name: str, s: dict) -> tuple[str, str]:
    if name not in TARGETS:
        return "", ""
    op, bound = TARGETS[name]
    ok = s["median"] >= bound if op == ">=" else s["median"] <= bound
    shown = f"{bound / 1e6:g} M/s" if s["unit"] == "tokens/s" else f"{bound:g} us"
    return f"{op} {shown}", "ok" if ok else "MISSED"


def run(out_path: str = DEFAULT_OUT, repeats: int = 15, command: str | None = None) -> dict:
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    results: dict[str, dict] = {}
    results["cold_alloc_free_256"] = bench_cold(256, repeats)
    results["cold_alloc_free_4096"] = bench_cold(4096, repeats)
    results["hot_allocate"], results["hot_release"] = bench_hot(repeats)
    results["radix_match_disjoint"] = bench_radix(repeats, common=0)
    results["radix_match_common_start"] = bench_radix(repeats, common=4096)
    cycles = {p: bench_cycle(p, repeats) for p in ("granikv", "token", "paged16")}

    rows = []
    for name, s in results.items():
        med, spread = _fmt(s)
        target, verdict = _verdict(name, s)
        rows.append((name, med, spread, target, verdict))
    for p, c in cycles.items():
        for k in ("cycle", "admit", "prefill", "decode_token", "release"):
            med, spread = _fmt(c[k])
            rows.append((f"{p}.{k}", med, spread, "", ""))
    head = ("metric", "median", "min..max", "target", "")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    print(f"allocator benchmark, {repeats} repeats (median of repeats, min..max across repeats)")
    print("\n".join(lines))

    report = dict(
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        machine=dict(platform=platform.platform(), processor=platform.processor() or platform.machine(),
                     cpu_count=os.cpu_count(), load_avg_1_5_15=[round(x, 2) for x in os.getloadavg()]),
        python=platform.python_version(), numpy=np.__version__, git_commit=_git_commit(),
        command=command or f"granisim.experiments.bench_alloc.run(out_path={out_path!r}, repeats={repeats})",
        repeats=repeats,
        targets={k: dict(op=op, bound=b, met=_verdict(k, results[k])[1] == "ok") for k, (op, b) in TARGETS.items()},
        results=results, cycles=cycles,
    )
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out_path}")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m granisim.experiments.bench_alloc", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON output path (default {DEFAULT_OUT}; '' to skip)")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    run(args.out, args.repeats, command=" ".join(["python -m granisim.experiments.bench_alloc", *argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
