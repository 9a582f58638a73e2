"""Extend (prefill-chunk) attention over a cached context in three storages, side by side:
a slab (start + length), a slot list over one contiguous run (how the engine reads a context
that lies in a HOT slab), and a slot list of random slots (the kernel table's `slots` class).

    python -m gpu_backend.bench.extend_storage --out OUT.json

Prints a table and writes JSON: per (context, chunk) the median/p10/p90 microseconds per layer
(Llama-3.1-8B heads, bf16, L2 flushed between repeats, plain launches) and the ratios to random slots.
"""
from __future__ import annotations

import argparse
import json

import torch

from gpu_backend.kernels import layout as L
from gpu_backend.bench.timing import bench
from gpu_backend.kernels.extend import extend_attention

N_KV, G, D = 8, 4, 128
POINTS = [(c, q) for c in (4096, 16384) for q in (64, 512, 2048, 4096, 8192)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pool-slots", type=int, default=2**20)
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    S = args.pool_slots
    kc = torch.randn(S, N_KV, D, device=dev, dtype=dt, generator=g)
    vc = torch.randn(S, N_KV, D, device=dev, dtype=dt, generator=g)
    i32 = lambda x: torch.as_tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    rows = []
    for c, q in POINTS:
        qq = torch.randn(q, N_KV * G, D, device=dev, dtype=dt, generator=g)
        kn, vn = (torch.randn(q, N_KV, D, device=dev, dtype=dt, generator=g) for _ in range(2))
        base = S // 3
        layouts = {"slab": L.Slabs(i32([base]), i32([c])),
                   "slot_run": L.SlotLists(i32([0, c]), torch.arange(base, base + c, device=dev, dtype=torch.int32)),
                   "slots_random": L.SlotLists(i32([0, c]),
                                               torch.randperm(S, device=dev, generator=g)[:c].to(torch.int32))}
        row = {"context": c, "chunk": q}
        for name, kv in layouts.items():
            t = bench(lambda kv=kv: extend_attention(q=qq, k_new=kn, v_new=vn, qo_indptr=i32([0, q]), k_cache=kc,
                                                     v_cache=vc, prefix=kv, max_qo_len=q, check=False))
            row[name] = {k: t[k] for k in ("median_us", "p10_us", "p90_us", "reps")}
        for name in ("slab", "slot_run"):
            row[f"{name}_vs_random"] = row[name]["median_us"] / row["slots_random"]["median_us"]
        rows.append(row)
        print(f"context {c:6d} chunk {q:5d}: slab {row['slab']['median_us']:9.1f} us  slot run "
              f"{row['slot_run']['median_us']:9.1f} us  random slots {row['slots_random']['median_us']:9.1f} us  "
              f"run/random {row['slot_run_vs_random']:.3f}", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model_heads": [N_KV * G, N_KV, D]}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
