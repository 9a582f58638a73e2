"""Decode attention: one query token per sequence over that sequence's KV (slot lists or a page
table, or a slab), GQA packed (the G query heads of a KV head form one row tile), split along
KV when fewer than a few programs per SM would run. Each request re-reads its whole KV: this is
the `paged` baseline path, and the suffix pass of `cascade`/`dense`.
"""
from __future__ import annotations

import torch

from . import layout as L
from .cascade import block_m_for, prepare
from .split_kv import SplitKvLaunch, default_scale

_ARANGE: dict = {}


def _one_per_group(b: int, device) -> torch.Tensor:
    key = (b, str(device))
    if key not in _ARANGE:
        _ARANGE[key] = torch.arange(b + 1, dtype=torch.int32, device=device)
    return _ARANGE[key]


def decode_launch(*, rows: int, n_q: int, n_kv: int, d: int, kv: L.KVLayout, max_kv_len: int, device,
                  mean_kv_len: int | None = None, sm_scale: float | None = None, block_n: int = 64,
                  num_warps: int = 4, num_stages: int = 3, kv_chunk: int | None = None) -> SplitKvLaunch:
    """The decode launch for `rows` requests (sequence b of `kv` is request b's KV), prepared once;
    call it with (q, k_cache, v_cache, out, lse). No checks: `decode_attention` checks."""
    return SplitKvLaunch(
        rows_total=rows, n_q=n_q, n_kv=n_kv, d=d, group_indptr=_one_per_group(rows, device), kv=kv,
        scale=default_scale(d, sm_scale), max_rows=1, max_kv_len=max_kv_len, block_m=block_m_for(n_q // n_kv),
        block_n=block_n, num_warps=num_warps, num_stages=num_stages, kv_chunk=kv_chunk, device=device,
        mean_kv_len=mean_kv_len)


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
    out, lse, scale, _, max_kv_len, mean_kv_len = prepare(
        q=q, k_cache=k_cache, v_cache=v_cache, group_indptr=_one_per_group(B, q.device), kv=kv, out=out, lse=lse,
        sm_scale=sm_scale, check=check, max_rows=1, max_kv_len=max_kv_len, kv_name="kv", mean_kv_len=mean_kv_len,
        balance=True)
    launch = decode_launch(rows=B, n_q=q.shape[1], n_kv=k_cache.shape[1], d=q.shape[2], kv=kv,
                           max_kv_len=max_kv_len, mean_kv_len=mean_kv_len, sm_scale=scale, device=q.device,
                           block_n=block_n, num_warps=num_warps, num_stages=num_stages, kv_chunk=kv_chunk)
    return launch(q, k_cache, v_cache, out, lse)
