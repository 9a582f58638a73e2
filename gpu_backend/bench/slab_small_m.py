"""Prefix passes over HOT slabs at small M_eff: the cascade launch against the dense (TMA) kernel with 64- and
128-row tiles, as CUDA-graph replays — is the M_sat dispatch leaving time on the table below it?

    python3 -m gpu_backend.bench.slab_small_m --out DIR
    TRITON_INTERPRET=1 python -m gpu_backend.bench.slab_small_m --out DIR --smoke     # CPU: tiny sizes

Problems: k groups (prefixes, one slab each) of B requests each, G = 4 (Llama-3.1-8B: 32 query heads over 8 KV
heads), L tokens a prefix; the engine's decode-step problem of the kernel issue is k = 4, B = 16, L = 16K. Each
variant is checked against the cascade's output (bf16 tolerance) and timed with L2 flushed between replays;
floor = prefix bytes / the run's device-to-device copy rate. Prints a table and writes slab_small_m.json.
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

from ..kernels.cascade import cascade_prefix_attention
from ..kernels.dense import dense_prefix_attention
from ..kernels import layout as L
from .problems import KV_BYTES_PER_TOKEN, Pool, i32, queries
from .timing import bench_replays, ceilings, write_run

CUDA = torch.cuda.is_available()
N_Q = 32


def variants(kw):
    yield "cascade", lambda: cascade_prefix_attention(**kw)
    for bm in (64, 128):
        yield f"dense_m{bm}", lambda bm=bm: dense_prefix_attention(**kw, block_m=bm, num_warps=4 if bm == 64 else 8)


def point(pool: Pool, k: int, B: int, Lp: int, copy_gbs: float | None) -> dict:
    q = queries(k * B, N_Q, pool.dtype)
    starts = [i * Lp for i in range(k)]
    prefix = L.Slabs(i32(starts), i32([Lp] * k))
    gp = i32([g * B for g in range(k + 1)])
    out = torch.empty_like(q)
    lse = torch.empty(k * B, N_Q, device=q.device)
    kw = dict(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=prefix, out=out, lse=lse, check=False,
              max_group_size=B, max_kv_len=Lp)
    by = k * Lp * KV_BYTES_PER_TOKEN
    row = {"k": k, "B": B, "L": Lp, "M_eff": B * N_Q // 8, "bytes": by,
           "floor_us": by / (copy_gbs * 1e9) * 1e6 if copy_gbs else None}
    ref = None
    for name, fn in variants(kw):
        fn()
        got = out.float().clone()
        if ref is None:
            ref = got
        err = (got - ref).abs().max().item()
        t = bench_replays(fn)
        row[name] = {"us": t["median_us"], "p10_us": t["p10_us"], "p90_us": t["p90_us"], "reps": t["reps"],
                     "max_abs_diff_vs_cascade": err}
        if row["floor_us"]:
            row[name]["x_floor"] = t["median_us"] / row["floor_us"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    grid = ([(1, 1, 128), (2, 4, 256)] if args.smoke else
            list(itertools.product((1, 4), (1, 4, 16, 32), (4096, 16384, 32768))))
    pool = Pool(max(k * Lp for k, _, Lp in grid) + 64)
    copy_gbs = ceilings(0.5)["copy_GBps"] if CUDA else None
    rows = [point(pool, k, B, Lp, copy_gbs) for k, B, Lp in grid]
    write_run(args.out, "slab_small_m", args.smoke, meta={"copy_GBps": copy_gbs}, rows=rows)
    names = [n for n, _ in variants({})]
    print(f"{'k':>2} {'B':>3} {'L':>6} {'M_eff':>5} {'floor us':>9} " + " ".join(f"{n:>12}" for n in names))
    for r in rows:
        fl = f"{r['floor_us']:9.1f}" if r["floor_us"] else f"{'-':>9}"
        print(f"{r['k']:>2} {r['B']:>3} {r['L']:>6} {r['M_eff']:>5} {fl} "
              + " ".join(f"{r[n]['us']:12.1f}" for n in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
