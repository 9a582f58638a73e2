"""How many KV tokens one split-KV program should walk at most (split_kv.balance_cap).

The engine's decode passes see sequences of very mixed lengths (Azure-trace suffixes: median
1K tokens, longest 14K), but the split count is planned from the longest one. This times the
decode and cascade launches the engine makes, as CUDA-graph replays, with no cap, with fixed
caps of 256..4096 tokens, with the mean-length rules max(1024, mean) and max(1024, 2 x mean) applied
to every batch, and with the shipped rule (`balance_cap`: max(BALANCE_CHUNK, mean) only where the
longest sequence exceeds BALANCE_SKEW x the mean). Runs of 2026-11-29: run 1 shipped the `mean` rule,
run 2 the `2xmean` rule, run 3 the skew rule:

- `suffix`  : B requests' own suffixes (slot lists), trace lengths — granikv's suffix pass;
- `token`   : the same requests with a shared L_p-token prefix in front (same slots for all,
              as the `token` policy stores it) — the baseline's whole-context decode;
- `uniform` : B requests of L random slots each (the calibration's decode grid);
- `cascade` : k groups of B/k members over their own L_p-token slab — granikv's prefix pass.

    python3 -m gpu_backend.bench.split_balance --out DIR     # GPU; writes split_balance.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from datetime import datetime, timezone

import numpy as np
import torch
import triton

from granisim.calibration.skew import trace_lengths

from ..kernels import layout as L
from ..kernels import split_kv
from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from .problems import N_KV, D, Pool, i32, queries
from .timing import bench, graph_of

N_Q = 32  # Llama-3.1-8B
SHIPPED = split_kv.balance_cap
CAPS = {"none": lambda longest, mean: 0,
        **{str(c): (lambda longest, mean, c=c: c) for c in (256, 512, 1024, 2048, 4096)},
        "mean": lambda longest, mean: max(split_kv.BALANCE_CHUNK, mean or 0),
        "2xmean": lambda longest, mean: max(split_kv.BALANCE_CHUNK, 2 * (mean or 0)),
        "shipped": SHIPPED}


def slot_lists(pool: Pool, lens, shared: int) -> tuple[L.SlotLists, int]:
    """Each sequence: the same `shared` slots, then its own distinct random slots."""
    order = pool.perm(pool.num_slots)
    prefix = order[:shared]
    own, at = [], shared
    for n in lens:
        own.append(torch.cat([prefix, order[at: at + int(n)]]))
        at += int(n)
    indptr = i32(np.concatenate([[0], np.cumsum([shared + int(n) for n in lens])]))
    return L.SlotLists(indptr, torch.cat(own).to(torch.int32)), max(shared + int(n) for n in lens)


def cases(pool: Pool, seed: int):
    """(name, launcher) pairs; each launcher is graph-capturable."""
    out = []
    for B in (32, 64, 128):
        lens = trace_lengths(B, seed + B)
        for shared in ((0, 1024, 16384) if B == 64 else (0,)):
            kv, mx = slot_lists(pool, lens, shared)
            q = queries(B, N_Q, pool.dtype)
            name = f"{'suffix' if not shared else 'token'} B={B} L_p={shared} max={mx}"
            mean = shared + int(np.ceil(lens.mean()))
            out.append((name, lambda q=q, kv=kv, mx=mx, mean=mean: decode_attention(
                q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, max_kv_len=mx, mean_kv_len=mean, check=False)))
    for B, Ln in ((16, 4096), (64, 4096), (64, 16384)):
        kv, mx = slot_lists(pool, [Ln] * B, 0)
        q = queries(B, N_Q, pool.dtype)
        out.append((f"uniform B={B} L={Ln}", lambda q=q, kv=kv, mx=mx: decode_attention(
            q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, max_kv_len=mx, mean_kv_len=mx, check=False)))
    for k, Lp in ((4, 16384), (16, 16384), (4, 4096), (16, 1024)):
        members = 64 // k
        slabs = L.Slabs(i32([g * Lp for g in range(k)]), i32([Lp] * k))
        gptr = i32(np.arange(k + 1) * members)
        q = queries(64, N_Q, pool.dtype)
        out.append((f"cascade k={k} L_p={Lp} B=64", lambda q=q, s=slabs, g=gptr, m=members, Lp=Lp:
                    cascade_prefix_attention(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=g, prefix=s,
                                             max_group_size=m, max_kv_len=Lp, mean_kv_len=Lp, check=False)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pool = Pool(1_500_000, seed=args.seed, n_kv=N_KV, d=D)
    rows = []
    for name, fn in cases(pool, args.seed):
        line = {"case": name}
        for cap, rule in CAPS.items():
            split_kv.balance_cap = rule
            fn()  # compile / warm up
            replay, _g = graph_of(fn)
            r = bench(replay, target_ms=40)
            line[f"cap_{cap}_us"] = round(r["median_us"], 1)
            line[f"cap_{cap}_p10_p90"] = (round(r["p10_us"], 1), round(r["p90_us"], 1))
            line[f"cap_{cap}_reps"] = r["reps"]
        split_kv.balance_cap = SHIPPED
        rows.append(line)
        best = min(CAPS, key=lambda c: line[f"cap_{c}_us"])
        print(f"{name:40s} " + " ".join(f"{c}:{line[f'cap_{c}_us']:7.1f}" for c in CAPS) + f"  best {best}",
              flush=True)
    ratios = {c: statistics.median(r[f"cap_{c}_us"] / r["cap_none_us"] for r in rows) for c in CAPS}
    res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("COMMIT", "unknown"), "caps": list(CAPS), "rows": rows,
           "median_ratio_vs_no_cap": ratios}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "split_balance.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("median time vs no cap:", {c: round(v, 3) for c, v in ratios.items()})


if __name__ == "__main__":
    main()
