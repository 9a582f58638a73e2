"""RMS norm with the residual add in front of it: one pass over a row instead of two kernels.

x_new = x + delta (rounded to x's dtype: the residual stream as an unfused add leaves it), then
normed = x_new / sqrt(mean(x_new^2) + eps) * w, in fp32, rounded once to the output dtype (torch's
``F.rms_norm`` computes in fp32 and rounds once too). Without ``delta`` it is the norm alone.
A program per row; the row is one block (hidden sizes up to 16K).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks

MAX_HIDDEN = 16384


@triton.jit
def _add_rms_norm_kernel(
    X, DELTA, W, XO, NO,               # X, DELTA, XO, NO [T, H] (rows strided, columns contiguous); W [H]
    n_cols, stride_x, stride_d, stride_xo, stride_no, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = x + tl.load(DELTA + row * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
        x = x.to(XO.dtype.element_ty)
        tl.store(XO + row * stride_xo + cols, x, mask=ok)
        x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(NO + row * stride_no + cols, (x * rstd * w).to(NO.dtype.element_ty), mask=ok)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float, *,
                 out_x: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta [T, H] (columns contiguous), w [H]. Returns (x + delta, its RMS norm); without `delta`,
    (x, its norm). `out_x` may alias x (each program reads its row before writing it)."""
    if check:
        checks.tensor("x", x, dim=2)
        T, H = x.shape
        if H > MAX_HIDDEN:
            raise ValueError(f"hidden size {H} over {MAX_HIDDEN}")
        checks.tensor("w", w, dim=1, device=x.device)
        if w.shape != (H,):
            raise ValueError(f"w must be [{H}], got shape {tuple(w.shape)}")
        for name, t in (("x", x), ("delta", delta), ("out_x", out_x), ("out", out)):
            if t is None:
                continue
            checks.tensor(name, t, dim=2, device=x.device)
            if t.shape != x.shape:
                raise ValueError(f"{name} must be [{T}, {H}], got shape {tuple(t.shape)}")
    T, H = x.shape
    out = torch.empty_like(x) if out is None else out
    if delta is None:
        out_x = x
    elif out_x is None:
        out_x = torch.empty_like(x)
    if T:
        block = triton.next_power_of_2(H)
        d = delta if delta is not None else x
        _add_rms_norm_kernel[(T,)](x, d, w, out_x, out, H, x.stride(0), d.stride(0), out_x.stride(0), out.stride(0),
                                   eps, HAS_DELTA=delta is not None, BLOCK=block,
                                   num_warps=8 if block >= 4096 else 4)
    return out_x, out
