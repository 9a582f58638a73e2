"""Tuning sweep (one device call): tile sizes, pipelining depth, split size, TMA vs block pointers.
Prints the best config per problem and writes tune.json; the winners become the launchers' defaults.

    PYTHONUNBUFFERED=1 python3 -m gpu_backend.bench.tune --out $OUT
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch

from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from ..kernels.dense import dense_prefix_attention
from .problems import KV_BYTES_PER_TOKEN, Pool, i32, queries, seqs
from .timing import bench, graph_of


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    t0 = time.time()
    pool = Pool(4 * 2**20)
    res = []

    def rec(kernel, prob, cfg, t, by):
        r = {"kernel": kernel, **prob, **cfg, "us": t["median_us"], "p10": t["p10_us"], "p90": t["p90_us"],
             "GBps": by / (t["median_us"] * 1e-6) / 1e9}
        res.append(r)

    # cascade: graph replays (launch gaps excluded), L = 16K, G = 4
    for kind, B in itertools.product(("slab", "slots"), (16, 256)):
        Lp = 16384
        kv = seqs(pool, kind, 1, Lp)
        q = queries(B, 32, pool.dtype)
        gp = i32([0, B])
        out, lse = torch.empty_like(q), torch.empty(B, 32, device="cuda")
        for bn, st, ch in itertools.product((64, 128), (2, 3, 4), (256, 512, 1024, 2048)):
            if time.time() - t0 > args.budget_s * 0.45:
                break
            cfg = dict(block_n=bn, num_stages=st, kv_chunk=ch)
            fn = lambda: cascade_prefix_attention(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp,  # noqa
                                                  prefix=kv, out=out, lse=lse, check=False, max_group_size=B,
                                                  max_kv_len=Lp, **cfg)
            try:
                rec("cascade", {"storage": kind, "L": Lp, "B": B}, cfg, bench(graph_of(fn)[0]), Lp * KV_BYTES_PER_TOKEN)
            except Exception as e:
                res.append({"kernel": "cascade", "storage": kind, "B": B, **cfg, "error": repr(e)[:300]})
    # decode: plain launches, each request its own KV
    for kind, (Lp, B) in itertools.product(("slots", "pages16"), ((4096, 64), (4096, 256), (16384, 1))):
        kv = seqs(pool, kind, B, Lp)
        q = queries(B, 32, pool.dtype)
        out, lse = torch.empty_like(q), torch.empty(B, 32, device="cuda")
        grid = (itertools.product((32, 64, 128), (2, 3, 4), (None,)) if B > 1 else
                itertools.product((64,), (3,), (256, 512, 1024, 2048)))
        for bn, st, ch in grid:
            if time.time() - t0 > args.budget_s * 0.7:
                break
            cfg = dict(block_n=bn, num_stages=st, kv_chunk=ch)
            try:
                t = bench(lambda: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, out=out, lse=lse,
                                                   check=False, max_kv_len=Lp, **cfg))
                rec("decode", {"storage": kind, "L": Lp, "B": B}, cfg, t, B * Lp * KV_BYTES_PER_TOKEN)
            except Exception as e:
                res.append({"kernel": "decode", "storage": kind, "B": B, **cfg, "error": repr(e)[:300]})
    # dense: plain launches, slab, M_eff = 1024 and 2048
    for B in (256, 512):
        Lp = 16384
        kv = seqs(pool, "slab", 1, Lp)
        q = queries(B, 32, pool.dtype)
        gp = i32([0, B])
        out, lse = torch.empty_like(q), torch.empty(B, 32, device="cuda")
        for bn, st, tma, ch in itertools.product((64, 128), (2, 3), (False, True), (None, 16384)):
            if time.time() - t0 > args.budget_s:
                break
            cfg = dict(block_n=bn, num_stages=st, use_tma=tma, kv_chunk=ch)
            try:
                t = bench(lambda: dense_prefix_attention(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp,
                                                         prefix=kv, out=out, lse=lse, check=False,
                                                         max_group_size=B, max_kv_len=Lp, **cfg))
                rec("dense", {"L": Lp, "B": B}, cfg, t, Lp * KV_BYTES_PER_TOKEN)
                res[-1]["TFLOPs"] = 4 * B * 32 * Lp * 128 / (t["median_us"] * 1e-6) / 1e12
            except Exception as e:
                res.append({"kernel": "dense", "B": B, **cfg, "error": repr(e)[:300]})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tune.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"tuning took {time.time() - t0:.0f} s; errors: {sum('error' in r for r in res)}")
    probs = {}
    for r in res:
        if "error" in r:
            print("ERROR", r)
            continue
        key = (r["kernel"], r.get("storage", ""), r["L"], r["B"])
        probs.setdefault(key, []).append(r)
    for key, rs in probs.items():
        rs.sort(key=lambda r: r["us"])
        cfgs = [f"{r['us']:.1f}us {r['GBps']:.0f}GB/s " +
                " ".join(f"{k}={r[k]}" for k in ("block_n", "num_stages", "kv_chunk", "use_tma") if k in r)
                for r in rs[:4]]
        print(key, "worst", f"{rs[-1]['us']:.1f}", "| best:", " ; ".join(cfgs))


if __name__ == "__main__":
    main()
