"""Seeded random weights with a real model's shapes, and the dense (non-attention) layers.

No downloads: every tensor is drawn from one seeded generator, scaled so activations stay
O(1) through any depth (projections ~ 1/sqrt(fan_in), residual branches damped), so greedy
tokens are stable under reordering of batch rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from granisim.models import ModelShape

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [h]
    wqkv: torch.Tensor  # [h, (n_q + 2 n_kv) d]
    bqkv: torch.Tensor | None  # [(n_q + 2 n_kv) d] (Qwen-2.5 has QKV bias)
    wo: torch.Tensor  # [n_q d, h]
    mlp_norm: torch.Tensor  # [h]
    w_gate_up: torch.Tensor  # [h, 2 I]
    w_down: torch.Tensor  # [I, h]


class RandomWeights:
    def __init__(self, shape: ModelShape, *, device="cpu", dtype: torch.dtype | None = None, seed: int = 0,
                 rope_theta: float = 500000.0):
        self.shape = shape
        self.device = torch.device(device)
        self.dtype = dtype or TORCH_DTYPES[shape.dtype]
        self.rope_theta = rope_theta
        # drawn on the target device: a Llama-3.1-8B's 8e9 values take seconds there, minutes on a CPU
        g = torch.Generator(device=self.device).manual_seed(seed)
        h, d, I = shape.hidden, shape.head_dim, shape.intermediate
        qkv = (shape.n_q_heads + 2 * shape.n_kv_heads) * d
        damp = 1.0 / math.sqrt(2 * shape.num_layers)

        def rnd(*size, scale):
            return (torch.randn(*size, generator=g, device=self.device) * scale).to(self.dtype)

        def norm_w():
            return (1.0 + 0.1 * torch.randn(h, generator=g, device=self.device)).to(self.dtype)

        self.embed = rnd(shape.vocab, h, scale=1.0)
        self.layers = []
        for _ in range(shape.num_layers):
            self.layers.append(LayerWeights(
                attn_norm=norm_w(),
                wqkv=rnd(h, qkv, scale=1.0 / math.sqrt(h)),
                bqkv=rnd(qkv, scale=0.02) if shape.qkv_bias else None,
                wo=rnd(shape.n_q_heads * d, h, scale=damp / math.sqrt(shape.n_q_heads * d)),
                mlp_norm=norm_w(),
                w_gate_up=rnd(h, 2 * I, scale=1.0 / math.sqrt(h)),
                w_down=rnd(I, h, scale=damp / math.sqrt(I)),
            ))
        self.final_norm = norm_w()
        self.lm_head = rnd(h, shape.vocab, scale=1.0 / math.sqrt(h))
        inv = 1.0 / (rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        self.inv_freq = inv.float().to(self.device)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, d/2] for absolute positions [T]; computed once per step, used by every layer."""
    ang = positions.float()[:, None] * inv_freq[None, :]
    return ang.cos()[:, None, :], ang.sin()[:, None, :]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x [T, heads, d]."""
    xf = x.float()
    x1, x2 = xf[..., : xf.shape[-1] // 2], xf[..., xf.shape[-1] // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def qkv_proj(w: RandomWeights, layer: LayerWeights, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor]):
    """x [T, h] -> q [T, n_q, d], k [T, n_kv, d], v [T, n_kv, d] with RoPE (``rot`` = rope_tables) on q, k."""
    s = w.shape
    y = rms_norm(x, layer.attn_norm) @ layer.wqkv
    if layer.bqkv is not None:
        y = y + layer.bqkv
    T, d = x.shape[0], s.head_dim
    q = y[:, : s.n_q_heads * d].view(T, s.n_q_heads, d)
    k = y[:, s.n_q_heads * d : (s.n_q_heads + s.n_kv_heads) * d].view(T, s.n_kv_heads, d)
    v = y[:, (s.n_q_heads + s.n_kv_heads) * d :].view(T, s.n_kv_heads, d).contiguous()
    return rope(q, *rot).contiguous(), rope(k, *rot).contiguous(), v


def mlp(layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP on the pre-normed residual stream; returns the branch output."""
    gu = rms_norm(x, layer.mlp_norm) @ layer.w_gate_up
    gate, up = gu.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ layer.w_down


def logits(w: RandomWeights, x_last: torch.Tensor) -> torch.Tensor:
    return (rms_norm(x_last, w.final_norm) @ w.lm_head).float()
