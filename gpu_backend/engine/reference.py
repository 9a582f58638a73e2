"""Plain torch reference forward: full causal attention over a whole context, no KV cache.

Used to check that the engine's greedy tokens equal what the model computes without any
paging, slabs, prefix passes or merges.
"""
from __future__ import annotations

import math

import torch

from ..reference import attention
from .model import RandomWeights, logits, mlp, qkv_proj, rope_tables


@torch.no_grad()
def next_token_logits(w: RandomWeights, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [vocab] (fp32) for the token after ``tokens`` (1-D int64)."""
    tokens = tokens.to(w.device)
    pos = torch.arange(tokens.numel(), device=w.device)
    x = w.embed[tokens]
    scale = 1.0 / math.sqrt(w.shape.head_dim)
    rot = rope_tables(pos, w.inv_freq)
    for layer in w.layers:
        q, k, v = qkv_proj(w, layer, x, rot)
        o, _ = attention(q, k, v, scale, causal_from=0)
        x = x + o.to(x.dtype).to(x.device).reshape(tokens.numel(), -1) @ layer.wo
        x = x + mlp(layer, x)
    return logits(w, x[-1:])[0]
