"""Decode-sized linear layers: torch.matmul (cuBLAS) against the split-K kernel, as % of copy bandwidth.

    python3 -m gpu_backend.bench.skinny_gemm --out DIR [--models llama-3.1-8b qwen-2.5-14b] [--rows 1 8 16 32 64 128]
    TRITON_INTERPRET=1 python -m gpu_backend.bench.skinny_gemm --out DIR --smoke     # CPU: tiny shapes, one config

For each model's five GEMMs (qkv, o, gate/up, down, LM head; `granisim.config.models` shapes, the engine's
fused weights) and each row count: torch.matmul and `skinny_linear` over a small sweep of tiles, warps and
split counts (the best config kept, every config in the JSON), each as a CUDA-graph replay with L2 flushed
between repeats (`timing.bench`), checked against torch's result (bf16). Bandwidth: weight bytes read / time,
and the floor's share: (weight bytes / the run's device-to-device copy rate) / time, the rate the kernel
issue's floor uses. Prints a table and writes skinny_gemm.json (the run's GPU, versions and ceilings in it).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
from pathlib import Path

import torch
import triton
from triton.runtime.errors import OutOfResources

from granisim.config.models import get_model

from ..kernels.skinny_gemm import MAX_ROWS, default_splits, skinny_linear
from .timing import bench_replays, ceilings

CUDA = torch.cuda.is_available()
CONFIGS = [dict(block_n=bn, block_k=bk, num_warps=nw) for bn, bk, nw in
           itertools.product((32, 64, 128), (64, 128, 256), (4, 8))]


def gemms(model: str) -> list[tuple[str, int, int]]:
    """(name, K, N) of one layer's GEMMs and the LM head, as the engine fuses them (x @ W^T, W [N, K])."""
    m = get_model(model)
    h, d = m.hidden, m.head_dim
    return [("qkv", h, (m.n_q_heads + 2 * m.n_kv_heads) * d), ("o", m.n_q_heads * d, h),
            ("gate_up", h, 2 * m.intermediate), ("down", m.intermediate, h), ("lm_head", h, m.vocab)]


def _share(v: float | None) -> str:
    return f"{100 * v:5.1f}%" if v is not None else "   -  "


def point(name: str, K: int, N: int, M: int, dtype, configs, copy_gbs: float | None) -> dict:
    dev = "cuda" if CUDA else "cpu"
    x = torch.randn(M, K, device=dev, dtype=dtype)
    w = torch.randn(N, K, device=dev, dtype=dtype) / K ** 0.5
    ref = torch.matmul(x, w.t())
    y = torch.empty_like(ref)
    torch_t = bench_replays(lambda: torch.matmul(x, w.t(), out=y))
    tried = []
    for c in configs:
        for mult in (1, 2):
            splits = mult * default_splits(N, K, c["block_n"], c["block_k"])
            if splits > -(-K // 16):
                continue
            try:
                out = skinny_linear(x, w, splits=splits, **c)
            except OutOfResources:  # this tile does not fit the machine's shared memory at M rows: not a candidate
                tried.append({**c, "splits": splits, "skipped": "out of shared memory"})
                continue
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-12)).item()
            t = bench_replays(lambda c=c, s=splits: skinny_linear(x, w, splits=s, **c))
            tried.append({**c, "splits": splits, "max_rel_err": err, **t})
    best = min((r for r in tried if "median_us" in r), key=lambda r: r["median_us"])
    wbytes = N * K * x.element_size()
    row = {"gemm": name, "M": M, "K": K, "N": N, "weight_bytes": wbytes, "torch": torch_t, "skinny": best,
           "configs": tried, "speedup": torch_t["median_us"] / best["median_us"]}
    for k in ("torch", "skinny"):
        s = row[k]["median_us"] * 1e-6
        row[f"{k}_TBps"] = wbytes / s / 1e12
        row[f"{k}_of_floor"] = (wbytes / (copy_gbs * 1e9)) / s if copy_gbs else None
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu_backend.bench.skinny_gemm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["llama-3.1-8b"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and one config (CPU, TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    bad = [m for m in args.rows if not 1 <= m <= MAX_ROWS]
    if bad:
        ap.error(f"--rows: each row count must be 1..{MAX_ROWS}, got {bad[0]}")
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16 if CUDA else torch.float32
    ceil = ceilings() if CUDA else {}
    copy = ceil.get("copy_GBps")
    doc = {"gpu": torch.cuda.get_device_name() if CUDA else platform.processor() or "cpu",
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "interpret": os.environ.get("TRITON_INTERPRET") == "1", "ceilings": ceil, "rows": []}
    shapes = [(m, g) for m in args.models for g in gemms(m)] if not args.smoke else [("smoke", ("tiny", 64, 48))]
    configs = CONFIGS if not args.smoke else [dict(block_n=32, block_k=32, num_warps=4)]
    print(f"{'model':14s} {'gemm':8s} {'M':>4s} {'torch us':>9s} {'TB/s':>5s} {'floor':>6s} {'skinny us':>9s} "
          f"{'TB/s':>5s} {'floor':>6s} {'speedup':>7s}  best config", flush=True)
    for model, (name, K, N) in shapes:
        for M in (args.rows if not args.smoke else [3]):
            r = point(name, K, N, M, dtype, configs, copy)
            r["model"] = model
            doc["rows"].append(r)
            b = r["skinny"]
            print(f"{model:14s} {name:8s} {M:4d} {r['torch']['median_us']:9.1f} {r['torch_TBps']:5.2f} "
                  f"{_share(r['torch_of_floor'])} {b['median_us']:9.1f} {r['skinny_TBps']:5.2f} {_share(r['skinny_of_floor'])} "
                  f"{r['speedup']:7.2f}  n{b['block_n']} k{b['block_k']} w{b['num_warps']} s{b['splits']}", flush=True)
            (args.out / "skinny_gemm.json").write_text(json.dumps(doc, indent=1) + "\n")  # kept as it grows
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
