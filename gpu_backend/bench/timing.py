"""Timing on the GPU: median of repeats with L2 flushed between them, CUDA-graph replays, ceilings.

Each repeat: read a 256 MiB buffer (evicts the 60 MB L2 with clean lines, so a prefix read in
the last repeat is not served from cache, as in a real step where other layers ran in between;
an earlier run that flushed by *writing* the buffer left L2 full of dirty lines whose write-back
the timed kernel then paid for, about 10 us at L = 16K — see reports/kernels/h200.md), record
an event, run, record an event. Plain launches include whatever launch gap the host leaves;
graph replays remove it. `write_run` saves a benchmark's points with what ran them.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch

_FLUSH = None


def flush_l2():
    """Read a 256 MiB buffer: L2 holds clean lines of it, none of the next launch's operands."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.ones(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    _FLUSH.sum()


def bench(fn, *, target_ms: float = 30.0, min_reps: int = 5, max_reps: int = 200, flush: bool = True) -> dict:
    """Median / p10 / p90 of fn's device time in microseconds."""
    if not torch.cuda.is_available():  # CPU smoke runs of the scripts: wall clock, one repeat
        t = time.perf_counter()
        fn()
        us = (time.perf_counter() - t) * 1e6
        return {"median_us": us, "p10_us": us, "p90_us": us, "reps": 1}
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    est = max(s.elapsed_time(e), 1e-3)
    n = int(min(max_reps, max(min_reps, target_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush:
            flush_l2()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends))
    return {"median_us": statistics.median(t), "p10_us": t[len(t) // 10], "p90_us": t[(9 * len(t)) // 10],
            "reps": n}


def graph_of(fn):
    """Capture fn (already warmed up, capture-safe) into a CUDA graph; returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay, g


def bench_replays(fn, **kw) -> dict:
    """`bench` of fn as CUDA-graph replays (fn run once first: `graph_of` wants it warm); on a CPU, of fn itself."""
    if not torch.cuda.is_available():
        return bench(fn, **kw)
    fn()
    return bench(graph_of(fn)[0], **kw)


def ceilings(copy_gib: float = 2.0) -> dict:
    """Device-to-device copy GB/s (read + written bytes) and bf16 8192^3 GEMM TFLOP/s, random data."""
    n = int(copy_gib * 2**30) // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    c = bench(lambda: dst.copy_(src), min_reps=10, flush=False)
    copy_gbs = 2 * n * 2 / (c["median_us"] * 1e-6) / 1e9
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    m = bench(lambda: a @ b, min_reps=10, flush=False)
    gemm = 2 * 8192**3 / (m["median_us"] * 1e-6) / 1e12
    return {"copy_GBps": copy_gbs, "copy": c, "copy_bytes": 2 * n * 2,
            "gemm_TFLOPs": gemm, "gemm": m, "gemm_shape": [8192, 8192, 8192]}


def write_run(out: Path, name: str, smoke: bool, meta: dict | None = None, **payload) -> None:
    """OUT/NAME.json: ``payload`` (e.g. rows=...) beside ``meta``: the GPU, torch and Python that ran it, and
    ``meta``'s own entries."""
    meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
            "python": platform.python_version(), "smoke": smoke, **(meta or {})}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, **payload}, indent=1))
