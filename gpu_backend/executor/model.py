"""Seeded random weights with a real model's shapes, and the dense (non-attention) layers.

No downloads: every tensor is drawn from one seeded generator, scaled so activations stay
O(1) through any depth (projections ~ 1/sqrt(fan_in), residual branches damped), so greedy
tokens are stable under reordering of batch rows.

The layer ops are the torch ops the calibration times (calibration/measure/linear.py `s_linear`):
``F.linear`` with [out, in] weights, ``F.rms_norm``, rotate-half RoPE in the model dtype,
``silu(gate) * up``, residual adds, ``F.embedding`` — so the cost model's ``linear`` term
prices exactly what the engine runs (`TorchLayers`). `FusedLayers` runs the same layers with their
element-wise work in three Triton kernels (residual add + RMS norm, RoPE in place, SwiGLU): fewer
launches and passes over the activations; the calibration does not time it yet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from granisim.config.models import ModelShape

from ..kernels.rms_norm import add_rms_norm
from ..kernels.rope import rope_
from ..kernels.swiglu import swiglu

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-5


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [h]
    wqkv: torch.Tensor  # [(n_q + 2 n_kv) d, h]
    bqkv: torch.Tensor | None  # [(n_q + 2 n_kv) d] (Qwen-2.5 has QKV bias)
    wo: torch.Tensor  # [h, n_q d]
    mlp_norm: torch.Tensor  # [h]
    w_gate_up: torch.Tensor  # [2 I, h]
    w_down: torch.Tensor  # [h, I]


class RandomWeights:
    def __init__(self, shape: ModelShape, *, device="cpu", dtype: torch.dtype | None = None, seed: int = 0,
                 rope_theta: float = 500000.0, keep=None):
        """``keep(name, tensor) -> tensor``, if given, is applied to each layer weight as it is drawn (a
        tensor-parallel rank keeps its slice: gpu_backend/executor/tp.py); the draws stay the same."""
        keep = keep or (lambda name, t: t)
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
            attn_norm = norm_w()
            wqkv = keep("wqkv", rnd(qkv, h, scale=1.0 / math.sqrt(h)))
            bqkv = keep("bqkv", rnd(qkv, scale=0.02)) if shape.qkv_bias else None
            wo = keep("wo", rnd(h, shape.n_q_heads * d, scale=damp / math.sqrt(shape.n_q_heads * d)))
            mlp_norm = norm_w()
            w_gate_up = keep("w_gate_up", rnd(2 * I, h, scale=1.0 / math.sqrt(h)))
            w_down = keep("w_down", rnd(h, I, scale=damp / math.sqrt(I)))
            self.layers.append(LayerWeights(attn_norm=attn_norm, wqkv=wqkv, bqkv=bqkv, wo=wo, mlp_norm=mlp_norm,
                                            w_gate_up=w_gate_up, w_down=w_down))
        self.final_norm = norm_w()
        self.lm_head = rnd(shape.vocab, h, scale=1.0 / math.sqrt(h))
        inv = 1.0 / (rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        self.inv_freq = inv.float().to(self.device)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, d] (both halves) for absolute positions [T]; computed once per step."""
    ang = positions.float()[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype)[:, None, :], ang.sin().to(dtype)[:, None, :]


def qkv_proj(w: RandomWeights, layer: LayerWeights, x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor]):
    """x [T, h] -> q [T, n_q, d], k [T, n_kv, d], v [T, n_kv, d] (views; each token's heads contiguous),
    RoPE (``rot`` = rope_tables) applied to q and k in one pass."""
    s = w.shape
    T, d, nq, nkv = x.shape[0], s.head_dim, s.n_q_heads, s.n_kv_heads
    y = F.linear(rms_norm(x, layer.attn_norm), layer.wqkv, layer.bqkv)
    qk = y[:, : (nq + nkv) * d].view(T, nq + nkv, d)
    cos, sin = rot
    rotated = torch.cat([-qk[..., d // 2:], qk[..., : d // 2]], dim=-1)
    qk = qk * cos + rotated * sin
    v = y[:, (nq + nkv) * d:].view(T, nkv, d)
    return qk[:, :nq], qk[:, nq:], v


def attn_out_and_mlp(layer: LayerWeights, x: torch.Tensor, attn: torch.Tensor, reduce=None) -> torch.Tensor:
    """Output projection + residual, then the SwiGLU MLP on the normed stream + residual. ``reduce``
    (tensor parallelism: the all-reduce) sums each row-parallel projection's partial outputs over ranks."""
    out = F.linear(attn.reshape(x.shape[0], -1), layer.wo)
    x = x + (reduce(out) if reduce else out)
    gate, up = F.linear(rms_norm(x, layer.mlp_norm), layer.w_gate_up).chunk(2, dim=-1)
    down = F.linear(F.silu(gate) * up, layer.w_down)
    return x + (reduce(down) if reduce else down)


def logits(w: RandomWeights, x_normed: torch.Tensor) -> torch.Tensor:
    """LM head over rows already through the final norm; fp32 logits."""
    return F.linear(x_normed, w.lm_head).float()


class TorchLayers:
    """A step's dense layers over the residual stream ``x`` [T, h], as torch ops (the calibrated path).
    ``reduce``: the all-reduce after each row-parallel projection (tensor parallelism)."""

    def __init__(self, w: RandomWeights, x: torch.Tensor, reduce=None):
        self.w, self.x, self.reduce = w, x, reduce

    def attn_in(self, layer: LayerWeights, rot):
        """q, k, v of the layer (RoPE applied)."""
        return qkv_proj(self.w, layer, self.x, rot)

    def attn_out_mlp(self, layer: LayerWeights, attn: torch.Tensor) -> None:
        self.x = attn_out_and_mlp(layer, self.x, attn, self.reduce)

    def final(self, rows: torch.Tensor) -> torch.Tensor:
        """The final norm of the rows to sample."""
        return rms_norm(torch.index_select(self.x, 0, rows), self.w.final_norm)


class FusedLayers:
    """`TorchLayers`' interface, the element-wise work fused: each residual add is done by the next norm's kernel
    (the MLP's output waits in ``pending`` for the next layer's, or the final, norm), RoPE rotates the QKV
    output in place, SwiGLU reads the gate/up output once. The residual stream is updated in place."""

    def __init__(self, w: RandomWeights, x: torch.Tensor, reduce=None):
        self.w, self.x, self.reduce = w, x, reduce
        self.pending = None  # the last MLP's output, not yet added to x

    def _add_norm(self, delta, norm_w):
        x, h = add_rms_norm(self.x, delta, norm_w, EPS, out_x=self.x, check=False)
        self.x = x
        return h

    def attn_in(self, layer: LayerWeights, rot):
        s = self.w.shape
        d, nq, nkv = s.head_dim, s.n_q_heads, s.n_kv_heads
        y = F.linear(self._add_norm(self.pending, layer.attn_norm), layer.wqkv, layer.bqkv)
        rope_(y, *rot, nq + nkv, d, check=False)
        T = y.shape[0]
        return (y[:, : nq * d].view(T, nq, d), y[:, nq * d: (nq + nkv) * d].view(T, nkv, d),
                y[:, (nq + nkv) * d:].view(T, nkv, d))

    def attn_out_mlp(self, layer: LayerWeights, attn: torch.Tensor) -> None:
        out = F.linear(attn.reshape(self.x.shape[0], -1), layer.wo)
        h = self._add_norm(self.reduce(out) if self.reduce else out, layer.mlp_norm)
        down = F.linear(swiglu(F.linear(h, layer.w_gate_up), check=False), layer.w_down)
        self.pending = self.reduce(down) if self.reduce else down

    def final(self, rows: torch.Tensor) -> torch.Tensor:
        pending = None if self.pending is None else torch.index_select(self.pending, 0, rows)
        return add_rms_norm(torch.index_select(self.x, 0, rows), pending, self.w.final_norm, EPS, check=False)[1]
