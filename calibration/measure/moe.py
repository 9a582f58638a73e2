"""Sections `linear_tp` and `grouped_gemm`: the single-GPU work of tensor-parallel and MoE replicas.

* linear_tp.csv — the model's QKV, O, gate/up and down GEMMs at the per-GPU shard shapes of tp = 2, 4, 8
  (heads and MLP columns divided by tp; granisim.config.models.ModelShape.shard), as the ``linear``
  section times tp = 1. One GPU does this work in a tp replica; the all-reduces between GPUs are not
  timed here (they need several GPUs).
* grouped_gemm.csv — an MoE layer's grouped GEMMs (all active experts in one launch): up+gate
  ``hidden -> 2 I`` and down ``I -> hidden`` of the MoE model (``--moe-model``, default qwen3-30b-a3b),
  for step sizes T = 1 .. 8K tokens with top-k routing spread uniformly: ``A = E (1 - (1 - k/E)^T)``
  experts active (rounded), ``ceil(T k / A)`` rows each. ``torch._grouped_mm`` on GPUs that have it
  (column ``impl``), else one matmul per active expert in the same graph.

Rows carry the FLOPs (rows padded per expert as the rows are given) and the bytes (the active experts'
weights + rows in and out), so the fit (granisim.calibration.moe_fit) is the same roofline as the linear
families'.
"""
from __future__ import annotations

import math

import torch

from granisim.config.models import get_model

from .common import CUDA, DEV, LIN_FIELDS, copies_for, rnd, time_calls
from .linear import token_grid

TP_FIELDS = ["tp"] + LIN_FIELDS
GG_FIELDS = ["family", "impl", "T", "experts", "active", "rows_per_expert", "K", "N", "bytes", "flops", "k", "reps",
             "median_us", "p10_us", "p90_us"]


def s_linear_tp(run):
    m = run.model
    h, q, kv, d, inter = m.hidden, m.n_q_heads, m.n_kv_heads, m.head_dim, m.intermediate
    dt = run.dtype
    b = 2 if dt == torch.bfloat16 else 4
    if run.args.smoke:
        h, q, kv, d, inter = 64, 8, 8, 16, 128
    ns = token_grid(run.args.smoke)
    for tp in (2, 4, 8):
        if q % tp or kv % tp or inter % tp:
            continue
        gemms = [("qkv_proj", "attn_pre_proj", h, (q + 2 * kv) // tp * d), ("o_proj", "attn_post_proj", q // tp * d, h),
                 ("mlp_up", "mlp_up_proj", h, 2 * inter // tp), ("mlp_down", "mlp_down_proj", inter // tp, h)]
        for fam, op, K, N in gemms:
            k = copies_for(K * N * b)
            ws = [rnd(N, K, dtype=dt) * 0.02 for _ in range(k)]
            x = rnd(ns[-1], K, dtype=dt)
            ys = [torch.empty(ns[-1], N, device=DEV, dtype=dt) for _ in range(k)]
            for n in ns:
                if run.out_of_time("linear_tp"):
                    return
                xn = x[:n]
                fns = [(lambda w=w, y=y: torch.matmul(xn, w.t(), out=y[:n])) for w, y in zip(ws, ys)]
                t = time_calls(fns, min_reps=3 if n >= 4096 else 5)
                run.row("linear_tp.csv", TP_FIELDS, dict(tp=tp, op=op, family=fam, n=n, K=K, N=N,
                                                         bytes=b * (K * N + n * (K + N)), flops=2 * n * K * N, **t))
            del ws, x, ys
        print(f"   tp {tp}: {len(ns)} token counts x 4 GEMMs (t = {run.elapsed():.0f} s)", flush=True)


def _grouped(x, w, offs, rows: int, out):
    """x [A*rows, K] @ w[e] [K, N] per expert block -> out [A*rows, N]."""
    if offs is not None:
        return torch._grouped_mm(x, w, offs=offs, out_dtype=x.dtype)
    for e in range(w.shape[0]):
        torch.matmul(x[e * rows:(e + 1) * rows], w[e], out=out[e * rows:(e + 1) * rows])
    return out


def s_grouped_gemm(run):
    name = getattr(run.args, "moe_model", None) or "qwen3-30b-a3b"
    m = get_model(name)
    E, topk, h, I = m.num_experts, m.experts_per_token, m.hidden, m.expert_intermediate
    dt = run.dtype
    b = 2 if dt == torch.bfloat16 else 4
    # powers of two and the midpoints between them: the fit's held-out rows (every other step size) sit between
    # measured neighbours a factor 1.5 apart, not 4
    Ts = sorted({1, 2, 3} | {p * f for p in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) for f in (1, 1.5)}
                | {8192})
    Ts = [int(t) for t in Ts]
    if run.args.smoke:
        E, topk, h, I = 8, 2, 64, 32
        Ts = [1, 4, 16, 64]
    use_gmm = CUDA and hasattr(torch, "_grouped_mm")
    for fam, K, N in (("moe_up", h, 2 * I), ("moe_down", I, h)):
        for T in Ts:
            if run.out_of_time("grouped_gemm"):
                return
            active = max(1, min(E, round(E * (1 - (1 - topk / E) ** T))))
            rows = math.ceil(T * topk / active)
            if use_gmm:
                rows = -(-rows // 16) * 16  # _grouped_mm wants 16-row aligned groups
            k = copies_for(active * K * N * b)
            ws = [rnd(active, K, N, dtype=dt) * 0.02 for _ in range(k)]
            x = rnd(active * rows, K, dtype=dt)
            outs = [torch.empty(active * rows, N, device=DEV, dtype=dt) for _ in range(k)]
            offs = torch.arange(1, active + 1, device=DEV, dtype=torch.int32) * rows if use_gmm else None
            impl = "torch._grouped_mm" if use_gmm else "matmul per expert"
            fns = [(lambda w=w, o=o: _grouped(x, w, offs, rows, o)) for w, o in zip(ws, outs)]
            try:
                t = time_calls(fns, min_reps=5)
            except (RuntimeError, TypeError) as e:  # no grouped GEMM for this GPU / dtype: per-expert matmuls
                if offs is None:
                    raise
                print(f"   torch._grouped_mm unavailable ({type(e).__name__}: {e}); matmul per expert", flush=True)
                use_gmm, offs, impl = False, None, "matmul per expert"
                fns = [(lambda w=w, o=o: _grouped(x, w, None, rows, o)) for w, o in zip(ws, outs)]
                t = time_calls(fns, min_reps=5)
            run.row("grouped_gemm.csv", GG_FIELDS, dict(
                family=fam, impl=impl, T=T, experts=E, active=active, rows_per_expert=rows, K=K, N=N,
                bytes=b * (active * K * N + active * rows * (K + N)), flops=2 * active * rows * K * N, **t))
            del ws, x, outs
        print(f"   {fam}: {len(Ts)} step sizes ({impl}; t = {run.elapsed():.0f} s)", flush=True)
