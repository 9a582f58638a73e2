"""A layer's element-wise work, torch ops (the engine's `TorchLayers`) against the fused kernels (`FusedLayers`).

    python3 -m gpu_backend.bench.layer_elementwise --out DIR [--models llama-3.1-8b qwen-2.5-14b] [--rows 1 64 2048]
    TRITON_INTERPRET=1 python -m gpu_backend.bench.layer_elementwise --out DIR --smoke   # CPU: tiny shapes

One layer's element-wise work between its GEMMs, on the model's shapes (bf16 on a GPU):
- torch: the attention norm, rotate-half RoPE of q and k (as `model.qkv_proj` runs it), the residual add, the
  MLP norm, silu(gate) * up and the second residual add: the ops the calibration times one by one;
- fused: `add_rms_norm` twice (each residual add done by the next norm), `rope_` in place, `swiglu`.
Each side as a CUDA-graph replay, median of repeats, L2 not flushed (the activations come straight from the GEMM
before them, as in the layer). Prints per-layer microseconds, the per-step sum over the model's layers and the
saving, and writes layer_elementwise.json (the GPU, versions and every point).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from granisim.config.models import MODELS, get_model

from ..executor.model import EPS, rope_tables
from ..kernels.rms_norm import add_rms_norm
from ..kernels.rope import rope_
from ..kernels.swiglu import swiglu
from .timing import bench_replays, write_run

CUDA = torch.cuda.is_available()


def point(model: str, rows: int, smoke: bool) -> dict:
    m = get_model(model)
    h, d, nq, nkv, inter = m.hidden, m.head_dim, m.n_q_heads, m.n_kv_heads, m.intermediate
    if smoke:
        h, d, nq, nkv, inter = 64, 16, 4, 1, 96
    dev, dt = ("cuda", torch.bfloat16) if CUDA else ("cpu", torch.float32)
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=dev).to(dt)

    x, delta, attn_out = rnd(rows, h), rnd(rows, h), rnd(rows, h)
    w1, w2 = rnd(h), rnd(h)
    y, gu = rnd(rows, (nq + 2 * nkv) * d), rnd(rows, 2 * inter)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    cos, sin = rope_tables(torch.arange(rows, device=dev) + 1000, inv, dt)

    def torch_layer():
        x1 = x + delta
        F.rms_norm(x1, (h,), w1, EPS)
        qk = y[:, : (nq + nkv) * d].view(rows, nq + nkv, d)
        qk * cos + torch.cat([-qk[..., d // 2:], qk[..., : d // 2]], dim=-1) * sin
        x2 = x1 + attn_out
        F.rms_norm(x2, (h,), w2, EPS)
        F.silu(gu[:, :inter]) * gu[:, inter:]

    xs, yf = x.clone(), y.clone()

    def fused_layer():
        add_rms_norm(xs, delta, w1, EPS, out_x=xs, check=False)
        rope_(yf, cos, sin, nq + nkv, d, check=False)
        add_rms_norm(xs, attn_out, w2, EPS, out_x=xs, check=False)
        swiglu(gu, check=False)

    t, f = bench_replays(torch_layer, flush=False), bench_replays(fused_layer, flush=False)
    layers = m.num_layers
    return {"model": model, "rows": rows, "layers": layers, "torch": t, "fused": f,
            "torch_step_us": t["median_us"] * layers, "fused_step_us": f["median_us"] * layers,
            "saved_step_us": (t["median_us"] - f["median_us"]) * layers}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["llama-3.1-8b", "qwen-2.5-14b"], choices=sorted(MODELS))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64, 256, 2048, 8192])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, two row counts (CPU interpreter)")
    args = ap.parse_args(argv)
    rows = [1, 5] if args.smoke else args.rows
    points = [point(mod, r, args.smoke) for mod in args.models for r in rows]
    write_run(args.out, "layer_elementwise", args.smoke, points=points)
    print(f"{'model':<14} {'rows':>6} {'torch us/layer':>15} {'fused us/layer':>15} {'step: torch ms':>15} "
          f"{'fused ms':>9} {'saved ms':>9}")
    for p in points:
        print(f"{p['model']:<14} {p['rows']:>6} {p['torch']['median_us']:>15.1f} {p['fused']['median_us']:>15.1f} "
              f"{p['torch_step_us'] / 1e3:>15.3f} {p['fused_step_us'] / 1e3:>9.3f} {p['saved_step_us'] / 1e3:>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
