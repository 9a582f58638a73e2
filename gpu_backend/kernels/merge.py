"""LSE merge of two partial attention states: the one merge used everywhere.

(o1, lse1) and (o2, lse2) are attention over disjoint key sets (natural-log LSE). Result:
o = (e^lse1 o1 + e^lse2 o2) / (e^lse1 + e^lse2), lse = log(e^lse1 + e^lse2), in fp32.
A state with lse = -inf is absent (an empty prefix or suffix; its o is ignored, even NaN);
both absent -> o = 0, lse = -inf.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks
from .grid import cdiv


@triton.jit
def _merge_kernel(
    O1, L1, O2, L2, O, LO,            # O* [R, D] (rows contiguous), L* [R] fp32
    n_rows, D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    rows = rows.to(tl.int64)
    offs = rows[:, None] * D + tl.arange(0, D)[None, :]
    l1 = tl.load(L1 + rows, mask=ok, other=float("-inf"))
    l2 = tl.load(L2 + rows, mask=ok, other=float("-inf"))
    o1 = tl.load(O1 + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    o2 = tl.load(O2 + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    m = tl.maximum(l1, l2)
    m = tl.where(m == float("-inf"), 0.0, m)
    w1 = tl.exp(l1 - m)
    w2 = tl.exp(l2 - m)
    tot = w1 + w2
    empty = tot == 0.0
    tot_safe = tl.where(empty, 1.0, tot)
    # an absent state (weight 0) contributes nothing, whatever its o holds
    o = (tl.where(w1[:, None] > 0, o1 * w1[:, None], 0.0)
         + tl.where(w2[:, None] > 0, o2 * w2[:, None], 0.0)) / tot_safe[:, None]
    tl.store(O + offs, o.to(O.dtype.element_ty), mask=ok[:, None])
    tl.store(LO + rows, tl.where(empty, float("-inf"), m + tl.log(tot_safe)), mask=ok)


class MergeLaunch:
    """The merge of `rows` states of head size `d`, sized once: call it per layer with
    (o1, lse1, o2, lse2, out, out_lse). No checks: `merge_states` checks."""

    def __init__(self, rows: int, d: int, block_r: int | None = None):
        br = block_r or max(1, min(64, 8192 // d))
        self.grid = (cdiv(rows, br),)
        self.rows = rows
        self.consts = dict(D=d, BLOCK_R=br, num_warps=4)

    def __call__(self, o1, lse1, o2, lse2, out, out_lse) -> None:
        if self.rows:
            _merge_kernel[self.grid](o1, lse1, o2, lse2, out, out_lse, self.rows, **self.consts)


def merge_states(
    *, o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor,
    out: torch.Tensor | None = None, out_lse: torch.Tensor | None = None, block_r: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """o1, o2 [..., d] contiguous (any float dtype each); lse1, lse2 [...] fp32.
    Returns out [..., d] (o1's dtype unless `out` given) and out_lse [...] fp32. `out` may alias o1."""
    checks.tensor("o1", o1, dim=o1.dim() if isinstance(o1, torch.Tensor) else 0)
    if o1.dim() < 2:
        raise ValueError(f"o1 must be [..., d], got shape {tuple(o1.shape)}")
    d = o1.shape[-1]
    checks.head_dim(d)
    checks.tensor("o2", o2, dim=o1.dim(), device=o1.device)
    if o2.shape != o1.shape:
        raise ValueError(f"o2 shape {tuple(o2.shape)} != o1 shape {tuple(o1.shape)}")
    for name, t in (("lse1", lse1), ("lse2", lse2)):
        checks.tensor(name, t, dim=o1.dim() - 1, dtypes=(torch.float32,), device=o1.device)
        if t.shape != o1.shape[:-1]:
            raise ValueError(f"{name} shape {tuple(t.shape)} != {tuple(o1.shape[:-1])}")
    for name, t in (("o1", o1), ("o2", o2), ("lse1", lse1), ("lse2", lse2)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    out = checks.out_tensor("out", out, o1.shape, out.dtype if out is not None else o1.dtype, o1.device)
    out_lse = checks.out_tensor("out_lse", out_lse, lse1.shape, torch.float32, o1.device)
    R = lse1.numel()
    if R == 0:
        return out, out_lse
    MergeLaunch(R, d, block_r)(o1, lse1, o2, lse2, out, out_lse)
    return out, out_lse
