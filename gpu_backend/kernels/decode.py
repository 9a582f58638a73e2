"""Decode attention: one query token per sequence over that sequence's KV (slot lists or a page
table, or a slab), GQA packed (the G query heads of a KV head form one row tile), split along
KV when fewer than a few programs per SM would run. Each request re-reads its whole KV: this is
the `paged` baseline path, and the suffix pass of `cascade`/`dense`.
"""
from __future__ import annotations

import torch

from .. import layout as L
from . import split_kv
from .cascade import block_m_for, prepare

_ARANGE: dict = {}


def _one_per_group(b: int, device) -> torch.Tensor:
    key = (b, str(device))
    if key not in _ARANGE:
        _ARANGE[key] = torch.arange(b + 1, dtype=torch.int32, device=device)
    return _ARANGE[key]


def decode_attention(
    *, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv: L.KVLayout,
    sm_scale: float | None = None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
    max_kv_len: int | None = None, mean_kv_len: int | None = None, check: bool = True,
    block_n: int = 64, num_warps: int = 4, num_stages: int = 3, kv_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, n_q, d]; sequence b of `kv` is request b's KV. Returns o [B, n_q, d], lse [B, n_q] fp32.

    A request with no KV gets o = 0, lse = -inf (merge treats it as absent).
    With `check=False` and `max_kv_len` given the call is CUDA-graph capturable; `mean_kv_len` lets
    it balance mixed lengths (split_kv.BALANCE_CHUNK; read on the host when `check` and not given).
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor [B, n_q, d], got {getattr(q, 'shape', q)!r}")
    B = q.shape[0]
    gptr = _one_per_group(B, q.device)
    out, lse, scale, _, max_kv_len, mean_kv_len = prepare(
        q=q, k_cache=k_cache, v_cache=v_cache, group_indptr=gptr, kv=kv, out=out, lse=lse,
        sm_scale=sm_scale, check=check, max_rows=1, max_kv_len=max_kv_len, kv_name="kv", mean_kv_len=mean_kv_len,
        balance=True)
    G = q.shape[1] // k_cache.shape[1]
    return split_kv.launch(
        q=q, k_cache=k_cache, v_cache=v_cache, group_indptr=gptr, kv=kv, out=out, lse=lse,
        sm_scale=scale, max_rows=1, max_kv_len=max_kv_len, block_m=block_m_for(G),
        block_n=block_n, num_warps=num_warps, num_stages=num_stages, kv_chunk=kv_chunk, mean_kv_len=mean_kv_len)
