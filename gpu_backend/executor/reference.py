"""Plain torch reference forward, float64: full causal attention over a whole context, no KV cache.

Checks the engine's logits and greedy tokens against what the model computes without any paging,
slabs, prefix passes or merges. Written apart from the engine's layer code (model.py): only the
weights are shared. The projections are slices of the fused weights multiplied out here, RoPE is
built from ``rope_theta`` (not the engine's ``inv_freq`` or ``rope_tables``), RMS norm, SwiGLU and
grouped-query attention are written out, and everything runs in float64, so a bug in the engine's
RoPE, projections, MLP or attention shows as a logit difference instead of being shared by both.
"""
from __future__ import annotations

import math

import torch

from .model import EPS, RandomWeights


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.double()


def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * _f64(weight)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, heads, d]: each dimension pair (i, i + d/2) rotated by the angle position * theta^(-2i/d)."""
    d = x.shape[-1]
    half = d // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64, device=x.device) / d)
    ang = positions.double()[:, None] * freq[None, :]  # [T, d/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention: q [T, n_q, d], k/v [T, n_kv, d] -> [T, n_q, d]; query head h reads
    KV head h // (n_q / n_kv)."""
    T, n_q, d = q.shape
    group = n_q // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@torch.no_grad()
def all_logits(w: RandomWeights, tokens: torch.Tensor) -> torch.Tensor:
    """Float64 logits [T, vocab] (on the CPU; computed on the weights' device): row p is the distribution of
    the token after ``tokens[: p + 1]`` (``tokens``: 1-D int64)."""
    s = w.shape
    nq, nkv, d, inter = s.n_q_heads, s.n_kv_heads, s.head_dim, s.intermediate
    tokens = tokens.to(w.device).long()
    T = tokens.numel()
    pos = torch.arange(T, device=w.device)
    x = _f64(w.embed[tokens])
    for layer in w.layers:
        wqkv = _f64(layer.wqkv)
        wq, wk, wv = wqkv[: nq * d], wqkv[nq * d: (nq + nkv) * d], wqkv[(nq + nkv) * d:]
        h = _norm(x, layer.attn_norm)
        q, k, v = h @ wq.T, h @ wk.T, h @ wv.T
        if layer.bqkv is not None:
            b = _f64(layer.bqkv)
            q, k, v = q + b[: nq * d], k + b[nq * d: (nq + nkv) * d], v + b[(nq + nkv) * d:]
        q = _rope(q.reshape(T, nq, d), pos, w.rope_theta)
        k = _rope(k.reshape(T, nkv, d), pos, w.rope_theta)
        o = _attention(q, k, v.reshape(T, nkv, d)).reshape(T, nq * d)
        x = x + o @ _f64(layer.wo).T
        wgu = _f64(layer.w_gate_up)
        h = _norm(x, layer.mlp_norm)
        gate, up = h @ wgu[:inter].T, h @ wgu[inter:].T
        x = x + (gate * torch.sigmoid(gate) * up) @ _f64(layer.w_down).T
    return (_norm(x, w.final_norm) @ _f64(w.lm_head).T).cpu()


def next_token_logits(w: RandomWeights, tokens: torch.Tensor) -> torch.Tensor:
    """Float64 logits [vocab] (CPU) for the token after ``tokens`` (1-D int64)."""
    return all_logits(w, tokens)[-1]
