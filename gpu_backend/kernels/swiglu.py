"""SwiGLU's gate: silu(gate) * up from the fused gate/up projection's output, one pass.

gu [T, 2 I] holds gate (columns 0..I-1) and up (I..2I-1) of each row; out [T, I] = gate * sigmoid(gate)
* up, in fp32, rounded once to the output dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks


@triton.jit
def _swiglu_kernel(GU, O, inter, stride_gu, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    g = tl.load(GU + t * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + t * stride_gu + inter + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(O + t * stride_o + cols, (g * tl.sigmoid(g) * u).to(O.dtype.element_ty), mask=ok)


def swiglu(gu: torch.Tensor, *, out: torch.Tensor | None = None, check: bool = True) -> torch.Tensor:
    """gu [T, 2 I] (columns contiguous) -> silu(gu[:, :I]) * gu[:, I:] as [T, I]."""
    if check:
        checks.tensor("gu", gu, dim=2)
        if gu.shape[1] % 2:
            raise ValueError(f"gu must be [T, 2 I], got shape {tuple(gu.shape)}")
    T, inter = gu.shape[0], gu.shape[1] // 2
    if out is None:
        out = torch.empty((T, inter), dtype=gu.dtype, device=gu.device)
    elif check:
        checks.tensor("out", out, dim=2, device=gu.device)
        if out.shape != (T, inter):
            raise ValueError(f"out must be [{T}, {inter}], got shape {tuple(out.shape)}")
    if T and inter:
        block = min(triton.next_power_of_2(inter), 1024)
        _swiglu_kernel[(T, triton.cdiv(inter, block))](gu, out, inter, gu.stride(0), out.stride(0), BLOCK=block,
                                                         num_warps=4)
    return out
