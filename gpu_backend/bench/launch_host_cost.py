"""Host microseconds per attention launch: the checked launcher vs its prepared launch (no GPU needed).

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/launch_host_cost.py [--out launch_host_cost.json]

The engine calls every attention launcher once per layer. `*_attention(..., check=False)` redoes
the launch's host work each call (argument checks, split plan, grid, scratch); the prepared
`*Launch` objects (gpu_backend/engine/launches.py builds them once per step) only launch. Here the
Triton kernels are replaced by a no-op, so the table is the Python host cost alone (on the GPU,
Triton's own launch path adds ~20-50 us a launch to both). Shapes: Llama-3.1-8B heads, 20 decode
rows of ~1K tokens, a cascade pass of 3 groups, a 20-row extend chunk, on CPU tensors.
Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import timeit
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from gpu_backend.kernels import layout as L
from gpu_backend.kernels import extend, kv_write, merge, split_kv
from gpu_backend.kernels.cascade import cascade_launch, cascade_prefix_attention
from gpu_backend.kernels.decode import decode_attention, decode_launch
from gpu_backend.kernels.extend import ExtendLaunch, extend_attention
from gpu_backend.kernels.kv_write import KvWriteLaunch, write_kv
from gpu_backend.kernels.merge import MergeLaunch, merge_states

B, NQ, NKV, D = 20, 32, 8, 128


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _stub_kernels() -> None:
    for mod, name in ((split_kv, "_split_kv_kernel"), (split_kv, "_combine_kernel"), (extend, "_extend_kernel"),
                      (merge, "_merge_kernel"), (kv_write, "_kv_write_kernel")):
        setattr(mod, name, _NoLaunch())


def cases() -> dict:
    dev, dt = torch.device("cpu"), torch.float16
    i32 = lambda x: torch.as_tensor(x, dtype=torch.int32)  # noqa: E731
    kc = torch.zeros(4096, NKV, D, dtype=dt)
    vc = kc.clone()
    q = torch.zeros(B, NQ, D, dtype=dt)
    o = torch.zeros(B, NQ, D, dtype=dt)
    lse = torch.zeros(B, NQ)
    k = torch.zeros(B, NKV, D, dtype=dt)
    slots = torch.arange(B, dtype=torch.int32)
    kv = L.SlotLists(torch.arange(B + 1, dtype=torch.int32) * 100, torch.arange(B * 100, dtype=torch.int32))
    gptr, prefix = i32([0, 5, 10, 20]), L.Slabs(i32([0, 1024, 2048]), i32([1000, 1000, 1000]))
    qo, ext_prefix = i32([0, B]), L.SlotLists(i32([0, 64]), torch.arange(64, dtype=torch.int32))
    dec = decode_launch(rows=B, n_q=NQ, n_kv=NKV, d=D, kv=kv, max_kv_len=3000, mean_kv_len=1000, device=dev)
    cas = cascade_launch(rows=B, n_q=NQ, n_kv=NKV, d=D, group_indptr=gptr, prefix=prefix, max_group_size=10,
                         max_kv_len=1000, mean_kv_len=1000, device=dev)
    ext = ExtendLaunch(n_q=NQ, n_kv=NKV, d=D, qo_indptr=qo, prefix=ext_prefix, max_qo_len=B)
    mrg, kvw = MergeLaunch(B * NQ, D), KvWriteLaunch(B, NKV * D)
    return {
        "decode": (lambda: decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, max_kv_len=3000, mean_kv_len=1000,
                                            out=o, lse=lse, check=False),
                   lambda: dec(q, kc, vc, o, lse)),
        "cascade": (lambda: cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gptr, prefix=prefix,
                                                     max_group_size=10, max_kv_len=1000, mean_kv_len=1000, out=o,
                                                     lse=lse, check=False),
                    lambda: cas(q, kc, vc, o, lse)),
        "extend": (lambda: extend_attention(q=q, k_new=k, v_new=k, qo_indptr=qo, k_cache=kc, v_cache=vc,
                                            prefix=ext_prefix, max_qo_len=B, out=o, lse=lse, check=False),
                   lambda: ext(q, k, k, kc, vc, o, lse)),
        "merge": (lambda: merge_states(o1=o, lse1=lse, o2=o, lse2=lse, out=o, out_lse=lse),
                  lambda: mrg(o, lse, o, lse, o, lse)),
        "kv_write": (lambda: write_kv(k_cache=kc, v_cache=vc, k=k, v=k, slots=slots, check=False),
                     lambda: kvw(kc, vc, k, k, slots)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("launch_host_cost.json"))
    ap.add_argument("--number", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    _stub_kernels()
    rows = []
    print(f"{'launch':10} {'checked us':>11} {'prepared us':>12}  (median of {args.repeat} x {args.number} calls)")
    for name, (checked, prepared) in cases().items():
        t = {}
        for kind, fn in (("checked", checked), ("prepared", prepared)):
            fn()
            runs = timeit.repeat(fn, number=args.number, repeat=args.repeat)
            per = sorted(r / args.number * 1e6 for r in runs)
            t[kind] = {"median_us": per[len(per) // 2], "min_us": per[0], "max_us": per[-1]}
        rows.append({"launch": name, **t})
        print(f"{name:10} {t['checked']['median_us']:11.1f} {t['prepared']['median_us']:12.1f}")
    meta = {"torch": torch.__version__, "python": sys.version.split()[0], "cpu": _cpu(), "number": args.number,
            "repeat": args.repeat}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


if __name__ == "__main__":
    main()
