"""Plain torch reference forward: full causal attention over a whole context, no KV cache.

Used to check that the engine's greedy tokens equal what the model computes without any
paging, slabs, prefix passes or merges.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels.reference import attention
from .model import RandomWeights, attn_out_and_mlp, logits, qkv_proj, rms_norm, rope_tables


@torch.no_grad()
def next_token_logits(w: RandomWeights, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [vocab] (fp32) for the token after ``tokens`` (1-D int64)."""
    tokens = tokens.to(w.device)
    pos = torch.arange(tokens.numel(), device=w.device)
    x = F.embedding(tokens, w.embed)
    scale = 1.0 / math.sqrt(w.shape.head_dim)
    rot = rope_tables(pos, w.inv_freq, w.dtype)
    for layer in w.layers:
        q, k, v = qkv_proj(w, layer, x, rot)
        o, _ = attention(q, k, v, scale, causal_from=0)
        x = attn_out_and_mlp(layer, x, o.to(x.dtype).to(x.device))
    return logits(w, rms_norm(x[-1:], w.final_norm))[0]
