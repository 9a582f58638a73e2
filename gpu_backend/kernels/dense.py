"""Dense prefix pass: the stacked queries of each prefix group against its contiguous HOT slab,
GEMM-shaped (128-row M tiles, num_warps 8, software-pipelined K/V tiles). K/V tiles arrive
through block pointers, or through TMA tensor descriptors (`use_tma=True`, Hopper+) — pick by
measurement (reports/kernels/h200.md). Split along KV when the M tiles alone would not fill
the GPU; partials are reduced by `split_kv._combine_kernel`.
"""
from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from . import layout as L
from .checks import num_sms
from .cascade import prepare
from .common import LOG2E, attend, attend_full, finish, group_program, stacked_queries, store_state
from .grid import cdiv
from .split_kv import default_scale, plan_splits, split_scratch
from granisim.costmodel import split_rule

DENSE_MAX_SPLITS = 16


@triton.jit
def _dense_kernel(
    Q, K, V, O, LSE, OP, LSEP,        # as split_kv._split_kv_kernel
    K_DESC, V_DESC,                   # TMA descriptors over K/V viewed [num_slots, n_kv * D] (USE_TMA)
    GROUP_PTR, START, LEN,            # slabs: group g's prefix is slots START[g] .. START[g] + LEN[g] - 1
    qk_scale, kv_chunk, n_kv, n_q, n_rows_total,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    G, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, USE_TMA: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h, s, g, q_start, n_rows = group_program(GROUP_PTR, n_kv, G)
    if pid_m * BLOCK_M >= n_rows:
        return
    q, tok, qh, row_ok = stacked_queries(Q, q_start, n_rows, pid_m, h, G, stride_qt, stride_qh, BLOCK_M, D)

    start = tl.load(START + g)
    length = tl.load(LEN + g)
    lo = s * kv_chunk
    hi = tl.minimum(lo + kv_chunk, length)
    n_full = tl.maximum(hi - lo, 0) // BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if USE_TMA:
        for i in range(n_full):
            row0 = start + lo + i * BLOCK_N
            k = K_DESC.load([row0, h * D])                                         # [BLOCK_N, D]
            v = V_DESC.load([row0, h * D])
            m_i, l_i, acc = attend_full(q, k, v, m_i, l_i, acc, qk_scale)
        tail = lo + n_full * BLOCK_N
        if tail < hi:
            pos = tail + tl.arange(0, BLOCK_N)
            ok = pos < hi
            k = K_DESC.load([start + tail, h * D])
            v = tl.where(ok[:, None], V_DESC.load([start + tail, h * D]), 0.0)   # rows past the slab
            m_i, l_i, acc = attend(q, k, v, ok[None, :], m_i, l_i, acc, qk_scale)
    else:
        # Block pointers bounded at the chunk's end: the tail tile reads zeros past it.
        k_blk = tl.make_block_ptr(K + h * stride_kh, shape=(start + hi, D), strides=(stride_kt, 1),
                                  offsets=(start + lo, 0), block_shape=(BLOCK_N, D), order=(1, 0))
        v_blk = tl.make_block_ptr(V + h * stride_vh, shape=(start + hi, D), strides=(stride_vt, 1),
                                  offsets=(start + lo, 0), block_shape=(BLOCK_N, D), order=(1, 0))
        for i in range(n_full):
            k = tl.load(k_blk)
            v = tl.load(v_blk)
            m_i, l_i, acc = attend_full(q, k, v, m_i, l_i, acc, qk_scale)
            k_blk = tl.advance(k_blk, (BLOCK_N, 0))
            v_blk = tl.advance(v_blk, (BLOCK_N, 0))
        tail = lo + n_full * BLOCK_N
        if tail < hi:
            pos = tail + tl.arange(0, BLOCK_N)
            k = tl.load(k_blk, boundary_check=(0,), padding_option="zero")
            v = tl.load(v_blk, boundary_check=(0,), padding_option="zero")
            m_i, l_i, acc = attend(q, k, v, (pos < hi)[None, :], m_i, l_i, acc, qk_scale)
    o, lse = finish(m_i, l_i, acc)
    store_state(O, LSE, OP, LSEP, o, lse, tok, qh, row_ok, s, n_q, n_rows_total, stride_ot, stride_oh, D, SPLIT)


def _dense_splits(base: int, max_kv_len: int, block_n: int, device, kv_chunk):
    """Splits for one 8-warp program per SM: the count (1..DENSE_MAX_SPLITS) whose last wave is fullest,
    per unit of work, against what each split's partials cost (granisim.costmodel.split_rule.dense_splits,
    which the cost model prices with; measured by gpu_backend/bench/dense_splits.py). H200 run: 160 programs
    (M_eff = 2560) in one unsplit launch ran 1.2 waves at 380 TFLOP/s against 600 for 128 programs."""
    if kv_chunk is not None or max_kv_len <= 0:
        return plan_splits(base_programs=base, max_kv_len=max_kv_len, block_n=block_n, device=device,
                           kv_chunk=kv_chunk)
    n, chunk = split_rule.dense_splits(base, max_kv_len, block_n, sms=num_sms(device), max_splits=DENSE_MAX_SPLITS)
    return int(n[0]), int(chunk[0])


def _descriptor(cache: torch.Tensor, block_n: int):
    from triton.tools.tensor_descriptor import TensorDescriptor
    n, h, d = cache.shape
    if cache.stride(1) != d or cache.stride(2) != 1:
        raise ValueError("use_tma needs each slot's [n_kv, d] row contiguous")
    return TensorDescriptor(cache, [n, h * d], [cache.stride(0), 1], [block_n, d])


class DenseLaunch:
    """One dense launch with its host work done once (splits, grid, scratch partials): call it per
    layer with (q, k_cache, v_cache, out, lse). No checks: `dense_prefix_attention` checks."""

    def __init__(self, *, rows: int, n_q: int, n_kv: int, d: int, group_indptr: torch.Tensor, prefix: L.Slabs,
                 max_group_size: int, max_kv_len: int, device, sm_scale: float | None = None,
                 block_m: int = 128, block_n: int = 128, num_warps: int = 8, num_stages: int = 3,
                 kv_chunk: int | None = None, use_tma: bool | None = None, fold: bool = False):
        G = n_q // n_kv
        n_groups = group_indptr.shape[0] - 1
        self.empty = rows == 0 or n_groups == 0
        m_tiles = max(1, cdiv(max_group_size * G, block_m))
        n_splits, chunk = _dense_splits(m_tiles * n_kv * n_groups, max_kv_len, block_n, device, kv_chunk)
        R = rows * n_q
        split = n_splits > 1 or fold
        self.partials, self.combine = split_scratch(n_splits, R, d, device, always=fold)
        if use_tma is None:
            use_tma = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
        self.use_tma, self.block_n = use_tma, block_n
        self.grid = (m_tiles, n_kv * n_splits, n_groups)
        self.meta = (group_indptr, prefix.start, prefix.length, default_scale(d, sm_scale) * LOG2E,
                     chunk, n_kv, n_q, R)
        self.consts = dict(G=G, D=d, BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=split, USE_TMA=use_tma,
                           num_warps=num_warps, num_stages=num_stages)

    def __call__(self, q, k_cache, v_cache, out, lse, extra=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`extra` (o2, lse2): merged into each row's result by the combine (a launch built with `fold`)."""
        if self.empty:
            return out, lse
        if extra is not None and self.combine is None:
            raise ValueError("extra state given to a launch built without fold")
        op, lsep = self.partials or (out, lse)
        if self.use_tma:
            self._launch(q, k_cache, v_cache, out, lse, op, lsep,
                         _descriptor(k_cache, self.block_n), _descriptor(v_cache, self.block_n))
        else:
            with warnings.catch_warnings():  # triton 3.7 deprecates block pointers; they are still measured here
                warnings.filterwarnings("ignore", message=".*make_block_ptr is deprecated.*")
                self._launch(q, k_cache, v_cache, out, lse, op, lsep, k_cache, v_cache)
        if self.combine:
            self.combine(op, lsep, out, lse, extra)
        return out, lse

    def _launch(self, q, k_cache, v_cache, out, lse, op, lsep, kd, vd) -> None:
        _dense_kernel[self.grid](
            q, k_cache, v_cache, out, lse, op, lsep, kd, vd, *self.meta,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), **self.consts)


def dense_prefix_attention(
    *, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    group_indptr: torch.Tensor, prefix: L.Slabs,
    sm_scale: float | None = None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
    max_group_size: int | None = None, max_kv_len: int | None = None, check: bool = True,
    block_m: int = 128, block_n: int = 128, num_warps: int = 8, num_stages: int = 3,
    kv_chunk: int | None = None, use_tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As `cascade_prefix_attention`, for prefixes held as HOT slabs only.

    `use_tma` defaults to True on Hopper-class GPUs (H200 sweep: 168 vs 197 us at M_eff = 1024,
    L = 16K) and to block pointers elsewhere."""
    if not isinstance(prefix, L.Slabs):
        raise TypeError(f"prefix must be Slabs for the dense pass, got {type(prefix).__name__}")
    out, lse, scale, max_rows, max_kv_len, _ = prepare(
        q=q, k_cache=k_cache, v_cache=v_cache, group_indptr=group_indptr, kv=prefix, out=out,
        lse=lse, sm_scale=sm_scale, check=check, max_rows=max_group_size, max_kv_len=max_kv_len,
        kv_name="prefix")
    launch = DenseLaunch(rows=q.shape[0], n_q=q.shape[1], n_kv=k_cache.shape[1], d=q.shape[2],
                         group_indptr=group_indptr, prefix=prefix, max_group_size=max_rows, max_kv_len=max_kv_len,
                         device=q.device, sm_scale=scale, block_m=block_m, block_n=block_n, num_warps=num_warps,
                         num_stages=num_stages, kv_chunk=kv_chunk, use_tma=use_tma)
    return launch(q, k_cache, v_cache, out, lse)
