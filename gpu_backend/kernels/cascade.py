"""Cascade prefix pass: each prefix group's decode queries stacked (M_eff = B_group * G rows per
KV head) over the group's shared prefix in any storage, split along KV, in ONE launch.

Kernel: `split_kv._split_kv_kernel` (+ `_combine_kernel` when split). The result is the
prefix half of each query's attention; merge it with the suffix half (`merge.merge_states`), or
build the launch with `fold` and give the suffix half to the call: its combine merges it in.
"""
from __future__ import annotations

import torch

from . import checks
from . import layout as L
from . import split_kv
from .grid import next_pow2


def block_m_for(rows: int) -> int:
    """Smallest power-of-two row tile >= rows, between 16 (tl.dot minimum) and 128."""
    return max(16, min(128, next_pow2(max(rows, 1))))


def prepare(*, q, k_cache, v_cache, group_indptr, kv, out, lse, sm_scale, check,
            max_rows, max_kv_len, kv_name, mean_kv_len=None, balance=False):
    """Shared argument checks for the split-KV launchers; returns (out, lse, scale, max_rows, max_kv_len,
    mean_kv_len). Lengths not given are read on the host (the mean only for launchers that `balance`
    mixed lengths, and only when `check` allows a device read)."""
    num_slots, n_kv, d = checks.kv_cache(k_cache, v_cache)
    checks.queries("q", q, n_kv=n_kv, d=d, dtype=k_cache.dtype, device=k_cache.device)
    T, n_q, _ = q.shape
    n_groups = group_indptr.shape[0] - 1 if isinstance(group_indptr, torch.Tensor) else None
    if check:
        L.check_indptr("group_indptr", group_indptr, None, T, k_cache.device)
        L.validate(kv, n=n_groups, num_slots=num_slots, device=k_cache.device, name=kv_name)
    elif L.num_seqs(kv) != n_groups:
        raise ValueError(f"{kv_name} describes {L.num_seqs(kv)} sequences, group_indptr {n_groups}")
    out = checks.out_tensor("out", out, (T, n_q, d), q.dtype, q.device)
    lse = checks.out_tensor("lse", lse, (T, n_q), torch.float32, q.device)
    if max_rows is None:
        p = group_indptr.cpu().long()
        max_rows = int((p[1:] - p[:-1]).max()) if n_groups else 0
    want_mean = balance and check and mean_kv_len is None
    if max_kv_len is None or want_mean:
        longest, mean = L.length_stats(kv)
        max_kv_len = longest if max_kv_len is None else max_kv_len
        mean_kv_len = mean if want_mean else mean_kv_len
    return out, lse, split_kv.default_scale(d, sm_scale), max_rows, max_kv_len, mean_kv_len


def cascade_launch(*, rows: int, n_q: int, n_kv: int, d: int, group_indptr: torch.Tensor, prefix: L.KVLayout,
                   max_group_size: int, max_kv_len: int, device, mean_kv_len: int | None = None,
                   sm_scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
                   num_warps: int | None = None, num_stages: int = 3,
                   kv_chunk: int | None = None, fold: bool = False) -> split_kv.SplitKvLaunch:
    """The cascade launch prepared once; call it with (q, k_cache, v_cache, out, lse). No checks:
    `cascade_prefix_attention` checks."""
    bm = block_m or block_m_for(max_group_size * (n_q // n_kv))
    return split_kv.SplitKvLaunch(
        rows_total=rows, n_q=n_q, n_kv=n_kv, d=d, group_indptr=group_indptr, kv=prefix,
        scale=split_kv.default_scale(d, sm_scale), max_rows=max_group_size, max_kv_len=max_kv_len, block_m=bm,
        block_n=block_n or (64 if bm <= 64 else 128), num_warps=num_warps or (4 if bm <= 64 else 8),
        num_stages=num_stages, kv_chunk=kv_chunk, device=device, mean_kv_len=mean_kv_len, fold=fold)


def cascade_prefix_attention(
    *, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    group_indptr: torch.Tensor, prefix: L.KVLayout,
    sm_scale: float | None = None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
    max_group_size: int | None = None, max_kv_len: int | None = None, mean_kv_len: int | None = None,
    check: bool = True,
    block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
    num_stages: int = 3, kv_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, n_q, d] sorted by group; group g owns rows group_indptr[g]:group_indptr[g+1] and its
    prefix is sequence g of `prefix`. Returns o [T, n_q, d] (q.dtype), lse [T, n_q] fp32 (natural log).

    `max_group_size` / `max_kv_len` / `mean_kv_len` (host ints) avoid a device read; with `check=False`
    and the first two given the call is CUDA-graph capturable (without `mean_kv_len` it then does not
    balance mixed lengths, see split_kv.BALANCE_CHUNK).
    """
    out, lse, scale, max_rows, max_kv_len, mean_kv_len = prepare(
        q=q, k_cache=k_cache, v_cache=v_cache, group_indptr=group_indptr, kv=prefix, out=out,
        lse=lse, sm_scale=sm_scale, check=check, max_rows=max_group_size, max_kv_len=max_kv_len,
        kv_name="prefix", mean_kv_len=mean_kv_len, balance=True)
    launch = cascade_launch(
        rows=q.shape[0], n_q=q.shape[1], n_kv=k_cache.shape[1], d=q.shape[2], group_indptr=group_indptr,
        prefix=prefix, max_group_size=max_rows, max_kv_len=max_kv_len, mean_kv_len=mean_kv_len, sm_scale=scale,
        device=q.device, block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
        kv_chunk=kv_chunk)
    return launch(q, k_cache, v_cache, out, lse)
