"""Rotate-half RoPE applied in place to a token's query and key heads, one pass.

Head j of token t (its d values: halves x1, x2) becomes (x1 cos - x2 sin, x2 cos + x1 sin) with
cos/sin of t's position (the first d/2 columns of the step's tables, whose halves are equal), in
fp32, rounded once to the tensor's dtype. The heads are the first `n_heads` of each row of a [T, W]
tensor (the QKV projection's output: q and k heads first, v after, left as it is).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks


@triton.jit
def _rope_kernel(
    Y, COS, SIN,                       # Y [T, W] rows strided; COS/SIN [T, >= HALF] rows strided
    n_heads, stride_y, stride_c, stride_s,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = (heads < n_heads)[:, None]
    j = tl.arange(0, HALF)
    first = Y + t * stride_y + heads[:, None] * (2 * HALF) + j[None, :]
    x1 = tl.load(first, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(COS + t * stride_c + j).to(tl.float32)[None, :]
    s = tl.load(SIN + t * stride_s + j).to(tl.float32)[None, :]
    tl.store(first, (x1 * c - x2 * s).to(Y.dtype.element_ty), mask=ok)
    tl.store(first + HALF, (x2 * c + x1 * s).to(Y.dtype.element_ty), mask=ok)


def rope_(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, d: int, *,
          check: bool = True) -> torch.Tensor:
    """Rotate heads 0..n_heads-1 (d wide each) of every row of y [T, W] in place; cos, sin [T, >= d/2]
    (or [T, 1, d], as `rope_tables` makes them). Returns y."""
    cos, sin = (c.reshape(c.shape[0], -1) if c.dim() == 3 else c for c in (cos, sin))
    if check:
        checks.tensor("y", y, dim=2)
        checks.head_dim(d)
        T, W = y.shape
        if n_heads < 0 or n_heads * d > W:
            raise ValueError(f"{n_heads} heads of {d} do not fit rows of {W} columns")
        for name, c in (("cos", cos), ("sin", sin)):
            checks.tensor(name, c, dim=2, device=y.device)
            if c.shape[0] != T or c.shape[1] < d // 2:
                raise ValueError(f"{name} must be [{T}, >= {d // 2}], got shape {tuple(c.shape)}")
    T = y.shape[0]
    if T and n_heads:
        block_h = min(triton.next_power_of_2(n_heads), 16)
        _rope_kernel[(T, triton.cdiv(n_heads, block_h))](y, cos, sin, n_heads, y.stride(0), cos.stride(0),
                                                          sin.stride(0), HALF=d // 2, BLOCK_H=block_h, num_warps=4)
    return y
