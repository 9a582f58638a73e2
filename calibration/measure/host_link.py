"""Section `host_link`: the host link of a host KV tier, slab vs page-granular transfer of the same prefix.

For prefixes of L tokens (every layer's K and V rows of the model), times moving them GPU -> host and back
through ``gpu_backend.executor.transfers.HostKV``, the code the real engine runs: (a) a HOT slab (GPU slots
one run, host slots one run: one copy across the link a staging chunk), (b) pages of 1 and 16 tokens scattered
on the GPU into one run of host slots (what a write-back of a fresh prefix gets), and (c) pages of 16 scattered
on both sides (a host tier whose free slots are fragmented: one copy per page). Rows: direction, kind, page,
host_run, tokens, bytes, pieces (copies across the link: runs of host slots), median_us, GB/s. :func:`fit`
turns them into the profile's ``host.link_bandwidth`` and ``host.copy_launch_s`` (least squares of
``t = fixed + bytes / bw`` over the slab rows) and ``host.page_copy_s`` with each direction's page bandwidth
(the page rows).

    python -m calibration.measure.host_link --out RAW [--model llama-3.1-8b] [--smoke]

On the CPU (``--smoke``, a tiny shape) it only checks that the section runs; the figures mean nothing there.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from calibration.measure.common import write_csv
from gpu_backend.executor.transfers import HostKV
from granisim.config.models import get_model
from granisim.kv.host_tier import KVTransfer
from granisim.kv.sequence import run_starts

FIELDS = ["direction", "kind", "page", "host_run", "tokens", "bytes", "pieces", "median_us", "gb_per_s"]


def _time(fn, reps: int, cuda: bool) -> float:
    out = []
    for _ in range(reps + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out[1:])


def measure(layers: int, kv_heads: int, head_dim: int, lengths, *, device: str, dtype=torch.bfloat16, reps: int = 5,
            pages=(1, 16)) -> list[dict]:
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    slots = 2 * max(lengths) + 16
    k = [torch.zeros(slots, kv_heads, head_dim, dtype=dtype, device=dev) for _ in range(layers)]
    v = [torch.zeros(slots, kv_heads, head_dim, dtype=dtype, device=dev) for _ in range(layers)]
    host = HostKV(layers, kv_heads, head_dim, dtype, dev, slots)
    per_token = 2 * layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
    rng = np.random.default_rng(0)
    rows = []
    for n in lengths:
        cases = [("slab", 0, n, np.arange(n), np.arange(n))]
        for p, run in [(p, n) for p in pages] + [(pages[-1], pages[-1])]:
            n_pages = -(-n // p)
            order = rng.permutation(slots // p)[:n_pages]
            idx = (order[:, None] * p + np.arange(p)).reshape(-1)[:n]
            runs = 2 * rng.permutation(slots // (2 * run))[: -(-n // run)]  # every other run: none adjacent
            h = (runs[:, None] * run + np.arange(run)).reshape(-1)[:n]
            cases.append(("pages", p, run, idx, h))
        for kind, p, run, g, h in cases:
            pieces = run_starts(h).size
            for direction in ("to_host", "to_gpu"):
                t = KVTransfer(direction, g, h, n * per_token, kind == "slab", pieces)
                s = _time(lambda: host.move(t, k, v), reps, cuda)
                rows.append(dict(direction=direction, kind=kind, page=p, host_run=run, tokens=n, bytes=n * per_token,
                                 pieces=pieces, median_us=s * 1e6, gb_per_s=n * per_token / s / 1e9))
    return rows


def fit(rows: list[dict]) -> dict[str, float]:
    """host.link_bandwidth, host.copy_launch_s (slab rows: ``t = fixed + bytes / bw``), and from the page rows
    (non-negative least squares of ``t = pieces * page_copy_s + bytes / page_bandwidth_<direction>``)
    host.page_copy_s and each direction's host.page_bandwidth_to_gpu / _to_host: a gather's bytes need not
    move at the link's rate (the engine gathers pages on the host side)."""
    from scipy.optimize import nnls

    slab = [r for r in rows if r["kind"] == "slab"]
    x = np.array([r["bytes"] for r in slab], float)
    y = np.array([r["median_us"] * 1e-6 for r in slab])
    a = np.vstack([np.ones_like(x), x]).T
    (fixed, inv_bw), *_ = np.linalg.lstsq(a, y, rcond=None)
    inv_bw = max(inv_bw, 1e-15)
    out = {"host.link_bandwidth": 1.0 / inv_bw, "host.copy_launch_s": max(0.0, float(fixed)), "host.page_copy_s": 0.0}
    pages = [r for r in rows if r["kind"] == "pages"]
    if pages:
        dirs = sorted({r.get("direction", "to_gpu") for r in pages})
        a = np.array([[r["pieces"], *(r["bytes"] * (r.get("direction", "to_gpu") == d) for d in dirs)] for r in pages],
                     float)
        y = np.array([r["median_us"] * 1e-6 for r in pages])
        scale = a.max(axis=0)  # columns of ~1e4 pieces and ~1e9 bytes: solve on a common scale
        coef = nnls(a / scale, y)[0] / scale
        out["host.page_copy_s"] = float(coef[0])
        for d, c in zip(dirs, coef[1:]):
            out[f"host.page_bandwidth_{d}"] = 1.0 / c if c > 0 else 1.0 / inv_bw
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.measure.host_link")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--smoke", action="store_true", help="tiny shape, runs anywhere (CPU included)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.smoke:
        rows = measure(2, 2, 8, (16, 64), device="cuda" if cuda else "cpu", dtype=torch.float32, reps=2)
    else:
        m = get_model(args.model)
        rows = measure(m.num_layers, m.n_kv_heads, m.head_dim, (1024, 4096, 16384), device="cuda")
    out = Path(args.out)
    write_csv(out / "host_link.csv", FIELDS, rows)
    for k, val in fit(rows).items():
        print(f"{k} = {val:.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
