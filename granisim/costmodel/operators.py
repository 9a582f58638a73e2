"""Operator work and rooflines: the FLOPs and bytes of each linear-operator family, the breakdown
keys, and the least-squares roofline fit the calibration uses (pure functions)."""

from __future__ import annotations

import numpy as np

from granisim.config.models import ModelShape

BREAKDOWN_KEYS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge",
                  "kv_write", "kv_copy", "overhead")
GEMM_FAMILIES = ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "lm_head")
ENGINE_KEYS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write")
ELEMENTWISE_FAMILIES = ("mlp_act", "norm", "rope", "add", "embedding")

# (family, table column, count) per layer, and per step (embedding, final norm).
LAYER_OPS = (("qkv_proj", "attn_pre_proj", 1), ("o_proj", "attn_post_proj", 1),
             ("mlp_up", "mlp_up_proj", 1), ("mlp_act", "mlp_act", 1), ("mlp_down", "mlp_down_proj", 1),
             ("norm", "input_layernorm", 1), ("norm", "post_attention_layernorm", 1),
             ("rope", "attn_rope", 1), ("add", "add", 2))
STEP_OPS = (("embedding", "emb", 1), ("norm", "input_layernorm", 1))

_MEMO_MAX = 200_000


# ---- operator work ---------------------------------------------------------------------------
def op_work(family: str, n, model: ModelShape):
    """(FLOPs, bytes) of one instance of an operator family over ``n`` tokens (rows) on one GPU's shard of
    ``model`` (its vocabulary rows: ``vocab_per_gpu``).

    ``n`` may be a number or a numpy array. GEMMs count weights once plus activations in and out.
    """
    h, q, kv, d, inter, vocab, b = (model.hidden, model.n_q_heads, model.n_kv_heads, model.head_dim,
                                    model.intermediate, model.vocab_per_gpu, model.dtype_bytes)
    gemm = {"qkv_proj": (h, (q + 2 * kv) * d), "o_proj": (q * d, h), "mlp_up": (h, 2 * inter),
            "mlp_down": (inter, h), "lm_head": (h, vocab)}
    if family in gemm:
        k, m = gemm[family]
        return 2.0 * n * k * m, float(b) * (k * m + n * (k + m))
    elementwise = {"mlp_act": 3 * inter, "norm": 2 * h, "rope": 2 * (q + kv) * d, "add": 3 * h,
                   "embedding": 2 * h}
    if family in elementwise:
        return 0.0 * n, float(b) * n * elementwise[family] + (b * h if family == "norm" else 0.0)
    raise ValueError(f"unknown operator family {family!r}")


def roofline_time(flops, nbytes, peak_flops: float, bandwidth: float, launch_s: float = 0.0,
                  flop_eff: float = 1.0, mem_eff: float = 1.0):
    """``launch_s + max(flops / (peak_flops * flop_eff), nbytes / (bandwidth * mem_eff))``."""
    return launch_s + np.maximum(flops / (peak_flops * flop_eff), nbytes / (bandwidth * mem_eff))


def fit_roofline(flops, nbytes, seconds, peak_flops: float, bandwidth: float,
                 max_launch_s: float | None = None) -> tuple[float, float, float]:
    """Least-squares fit (relative error) of ``(launch_s, flop_eff, mem_eff)`` in :func:`roofline_time`.

    Grid search over the two efficiencies (log-spaced, refined twice around the best point),
    ``0 <= launch_s <= max_launch_s`` solved in closed form for each. With all ``flops == 0``
    ``flop_eff`` is returned as 1.0. Bounding the launch keeps the fit physical: an unbounded
    one absorbs the smooth memory->compute transition of GEMMs into a large constant that would
    not carry over to another GPU.
    """
    f = np.asarray(flops, float)
    by = np.asarray(nbytes, float)
    t = np.asarray(seconds, float)
    w = 1.0 / t**2

    def launch_for(m):  # m [..., N] modelled time without launch -> best launch >= 0
        return np.clip(((t - m) * w).sum(-1) / w.sum(), 0.0, max_launch_s)

    def loss(m, c):
        return (((c[..., None] + m - t) / t) ** 2).sum(-1)

    lo, hi = np.log(1e-3), 0.0
    if not np.any(f > 0):
        grid = np.linspace(lo, hi, 400)
        for _ in range(3):
            em = np.exp(grid)
            m = by[None, :] / (bandwidth * em[:, None])
            c = launch_for(m)
            i = int(np.argmin(loss(m, c)))
            step = grid[1] - grid[0]
            best = (float(c[i]), 1.0, float(em[i]))
            grid = np.linspace(max(lo, grid[i] - 2 * step), min(hi, grid[i] + 2 * step), 400)
        return best
    gf = np.linspace(lo, hi, 120)
    gm = np.linspace(lo, hi, 120)
    for _ in range(3):
        ef, em = np.exp(gf), np.exp(gm)
        m = np.maximum(f[None, None, :] / (peak_flops * ef[:, None, None]),
                       by[None, None, :] / (bandwidth * em[None, :, None]))
        c = launch_for(m)
        err = loss(m, c)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        best = (float(c[i, j]), float(ef[i]), float(em[j]))
        sf, sm = gf[1] - gf[0], gm[1] - gm[0]
        gf = np.linspace(max(lo, gf[i] - 2 * sf), min(hi, gf[i] + 2 * sf), 120)
        gm = np.linspace(max(lo, gm[j] - 2 * sm), min(hi, gm[j] + 2 * sm), 120)
    return best
