"""Split-KV (flash-decoding) attention of stacked query rows over KV in any storage.

The engine room of `decode` (one query per sequence) and `cascade` (the queries of a prefix
group stacked into M_eff = B_group * G rows per KV head). Program (m, h * S + s, g) takes rows
[m * BLOCK_M, (m + 1) * BLOCK_M) of group g's stacked rows for KV head h, and KV positions
[s * kv_chunk, (s + 1) * kv_chunk) of the group's sequence. With S = 1 it writes o, lse
directly; with S > 1 it writes fp32 partials and `_combine_kernel` reduces them.
Row index m is the fastest grid axis, so programs that share K/V tiles run together (L2).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import layout as L
from .checks import num_sms
from .common import LOG2E, attend, attend_full, finish, group_program, kv_span, slot_ids, stacked_queries, store_state
from .grid import cdiv, next_pow2
from granisim.costmodel import split_rule

# How far to split along KV (H200 runs, reports/kernels/h200.md "Defaults"):
# - gathered storages (slot lists, pages) with row tiles <= 64: about 2 programs per SM, rounded up
#   (run 2 decode grid: 4.0 TB/s at B = 16, L = 16K against 2.4 with one program per SM; run 3
#   cascade sweep: 30 vs 39 us at L = 16K, B = 1) — the dependent index loads want more in flight;
# - slabs, and 128-row tiles (one program fits per SM): one program per SM in whole waves
#   (run 3: 27.8 vs 32.8 us at L = 16K, B = 16; 78 vs 83 us at B = 64).
CTAS_PER_SM = 1
MIN_CHUNK = 256   # tokens per split, at least
MAX_SPLITS = 64   # the combine holds all of a row's splits at once
# Load balance over mixed lengths: the split count comes from the LONGEST sequence, so without a
# cap one program walks the longest sequence alone while the others idle (Azure-trace suffixes:
# median 1K tokens, longest 14K). A launch given the batch's mean length, whose longest sequence is
# more than BALANCE_SKEW x the mean, cuts every sequence into splits of at most
# max(BALANCE_CHUNK, mean) tokens; short sequences leave their extra splits empty (programs that
# exit at once). Batches of similar lengths are not split further: at L_p = 16K the `token` decode
# (all requests reading one shared prefix, longest < 2x mean) ran 23% slower with 2 splits than
# with 1, while a cap at the mean sped up skewed batches (H200 grids at cap = mean and cap = 2 x mean,
# reports/engine/h200.md; reports/kernels/split_balance/README.md).
BALANCE_CHUNK = 1024
BALANCE_SKEW = 2


@triton.jit
def _split_kv_kernel(
    Q, K, V, O, LSE, OP, LSEP,        # Q [T, n_q, D]; K, V [slots, n_kv, D]; O [T, n_q, D]; LSE [T, n_q]
    GROUP_PTR, A, B, C,               # GROUP_PTR [n_groups + 1] query rows; A/B/C: storage (common.py)
    qk_scale, kv_chunk, n_kv, n_q, n_rows_total,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    G, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MODE: tl.constexpr, PAGE: tl.constexpr, SPLIT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h, s, g, q_start, n_rows = group_program(GROUP_PTR, n_kv, G)
    if pid_m * BLOCK_M >= n_rows:
        return
    q, tok, qh, row_ok = stacked_queries(Q, q_start, n_rows, pid_m, h, G, stride_qt, stride_qh, BLOCK_M, D)

    base, length = kv_span(MODE, g, A, C)
    lo = s * kv_chunk
    hi = tl.minimum(lo + kv_chunk, length)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    offs_d = tl.arange(0, D)
    k_base = K + h * stride_kh + offs_d[None, :]
    v_base = V + h * stride_vh + offs_d[None, :]
    tail = lo
    if BLOCK_M >= 128:  # compute-bound tiles: whole K/V tiles skip the mask (H100: 1.05-1.3x at B >= 64);
        # smaller tiles are latency-bound and the extra loop cost them 1-7%, so they mask every tile
        n_full = tl.maximum(hi - lo, 0) // BLOCK_N
        for i in range(n_full):
            pos = lo + i * BLOCK_N + tl.arange(0, BLOCK_N)
            slots = slot_ids(MODE, B, base, pos, pos < hi, PAGE)                   # [BLOCK_N]
            k = tl.load(k_base + slots[:, None] * stride_kt)                       # [BLOCK_N, D]
            v = tl.load(v_base + slots[:, None] * stride_vt)
            m_i, l_i, acc = attend_full(q, k, v, m_i, l_i, acc, qk_scale)
        tail = lo + n_full * BLOCK_N
    for start in range(tail, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        ok = pos < hi
        slots = slot_ids(MODE, B, base, pos, ok, PAGE)                             # [BLOCK_N]
        k = tl.load(k_base + slots[:, None] * stride_kt, mask=ok[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(v_base + slots[:, None] * stride_vt, mask=ok[:, None], other=0.0)  # [BLOCK_N, D]
        m_i, l_i, acc = attend(q, k, v, ok[None, :], m_i, l_i, acc, qk_scale)
    o, lse = finish(m_i, l_i, acc)
    store_state(O, LSE, OP, LSEP, o, lse, tok, qh, row_ok, s, n_q, n_rows_total, stride_ot, stride_oh, D, SPLIT)


@triton.jit
def _combine_kernel(
    OP, LSEP, O, LSE,                 # OP [S, R, D] fp32; LSEP [S, R]; O [T, n_q, D]; LSE [T, n_q] (R = T * n_q)
    O2, LSE2,                         # HAS_EXTRA: one more state of each row, O2 [T, n_q, D], LSE2 [T, n_q] fp32
    n_rows_total, n_splits, n_q, stride_ot, stride_oh, stride_o2t, stride_o2h,
    D: tl.constexpr, BLOCK_S: tl.constexpr, HAS_EXTRA: tl.constexpr,
):
    """One row per program, all its splits loaded at once (no serial chain over splits). With HAS_EXTRA the
    row's state (O2, LSE2) over other keys joins as one more split: the LSE merge folded into the combine."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    ok = s < n_splits
    offs_d = tl.arange(0, D)
    tok = row // n_q
    qh = row % n_q
    lse_s = tl.load(LSEP + s * n_rows_total + row, mask=ok, other=float("-inf"))     # [BLOCK_S]
    part = tl.load(OP + (s * n_rows_total + row)[:, None] * D + offs_d[None, :],
                   mask=ok[:, None], other=0.0)                                       # [BLOCK_S, D]
    m = tl.max(lse_s, 0)
    if HAS_EXTRA:
        lse2 = tl.load(LSE2 + row)
        m = tl.maximum(m, lse2)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe)                                                        # empty split -> 0
    tot = tl.sum(w, 0)
    o = tl.sum(w[:, None] * part, 0)
    if HAS_EXTRA:
        w2 = tl.exp(lse2 - m_safe)
        o2 = tl.load(O2 + tok * stride_o2t + qh * stride_o2h + offs_d).to(tl.float32)
        o += tl.where(w2 > 0, w2 * o2, 0.0)                                          # an absent state: even NaN
        tot += w2
    empty = tot == 0.0
    o = o / tl.where(empty, 1.0, tot)
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, tot)))
    tl.store(O + tok * stride_ot + qh * stride_oh + offs_d, o.to(O.dtype.element_ty))
    tl.store(LSE + row, lse)


class Combine:
    """Reduce split partials [S, R, D] into out [T, n_q, D] / lse [T, n_q]; sized once, run per layer. `extra`
    (o2 [T, n_q, D], lse2 [T, n_q]): each row's state over other keys, merged in (the suffix of a prefix pass)."""

    def __init__(self, n_splits: int, rows_total: int, d: int):
        bs = next_pow2(n_splits)
        self.grid = (rows_total,)
        self.args = (rows_total, n_splits)
        self.consts = dict(D=d, BLOCK_S=bs, num_warps=4 if bs * d <= 2048 else 8)

    def __call__(self, op, lsep, out, lse, extra=None) -> None:
        o2, lse2 = extra if extra is not None else (out, lse)
        _combine_kernel[self.grid](op, lsep, out, lse, o2, lse2, *self.args, out.shape[1], out.stride(0),
                                   out.stride(1), o2.stride(0), o2.stride(1), HAS_EXTRA=extra is not None,
                                   **self.consts)


def split_scratch(n_splits: int, rows_total: int, d: int, device, always: bool = False):
    """(fp32 partials [S, R, D] and [S, R], their Combine) for a launch cut into `n_splits`; (None, None) unsplit
    unless `always` (a launch that folds another state in through its combine)."""
    if n_splits <= 1 and not always:
        return None, None
    return ((torch.empty((n_splits, rows_total, d), dtype=torch.float32, device=device),
             torch.empty((n_splits, rows_total), dtype=torch.float32, device=device)), Combine(n_splits, rows_total, d))


def plan_splits(*, base_programs: int, max_kv_len: int, block_n: int, device,
                kv_chunk: int | None = None, ctas_per_sm: float | None = None,
                round_up: bool = False, max_chunk: int = 0) -> tuple[int, int]:
    """(n_splits, kv_chunk): split along KV until about `ctas_per_sm` programs per SM would run
    (rounding the split count up, or down for compute-heavy kernels that want whole waves), and
    until no split is longer than `max_chunk` tokens (0: no such cap). The rule is
    granisim.costmodel.split_rule.kv_splits, which the cost model prices with."""
    if kv_chunk is not None:
        if kv_chunk <= 0 or kv_chunk % block_n:
            raise ValueError(f"kv_chunk = {kv_chunk} must be a positive multiple of block_n={block_n}")
        n = max(1, cdiv(max_kv_len, kv_chunk))
        if n > MAX_SPLITS:
            raise ValueError(f"kv_chunk = {kv_chunk} gives {n} splits of max_kv_len={max_kv_len}; "
                             f"at most {MAX_SPLITS}")
        return n, kv_chunk
    target = (ctas_per_sm or CTAS_PER_SM) * num_sms(device)
    n, chunk = split_rule.kv_splits(base_programs, max_kv_len, block_n, target=target, round_up=round_up,
                                    min_chunk=MIN_CHUNK, max_splits=MAX_SPLITS, max_chunk=max_chunk)
    return int(n), int(chunk)


def balance_cap(max_kv_len: int, mean_kv_len: int | None) -> int:
    """Longest split for a batch of these longest / mean lengths (0: no cap — mean unknown, or no
    sequence longer than BALANCE_SKEW x the mean)."""
    if not mean_kv_len:
        return 0
    return int(split_rule.balance_cap(max_kv_len, mean_kv_len, balance_chunk=BALANCE_CHUNK,
                                      balance_skew=BALANCE_SKEW))


class SplitKvLaunch:
    """One split-KV launch with its host work done once (splits, grid, scratch partials): call it per
    layer with that layer's tensors. `rows_total` query rows of `n_q` heads; group g owns rows
    group_indptr[g]:group_indptr[g+1] (at most `max_rows`) and reads sequence g of `kv`."""

    def __init__(self, *, rows_total: int, n_q: int, n_kv: int, d: int, group_indptr, kv: L.KVLayout,
                 scale: float, max_rows: int, max_kv_len: int, block_m: int, block_n: int, num_warps: int,
                 num_stages: int, kv_chunk: int | None, device, mean_kv_len: int | None = None,
                 fold: bool = False):
        G = n_q // n_kv
        n_groups = group_indptr.shape[0] - 1
        self.empty = rows_total == 0 or n_groups == 0
        m_tiles = max(1, cdiv(max_rows * G, block_m))
        mode, A, B, C, page = L.kernel_args(kv)
        gather = mode != L.MODE_SLAB and block_m <= 64
        n_splits, chunk = plan_splits(base_programs=m_tiles * n_kv * n_groups, max_kv_len=max_kv_len,
                                      block_n=block_n, device=device, kv_chunk=kv_chunk,
                                      ctas_per_sm=2 if gather else 1, round_up=gather,
                                      max_chunk=balance_cap(max_kv_len, mean_kv_len))
        R = rows_total * n_q
        split = n_splits > 1 or fold
        self.partials, self.combine = split_scratch(n_splits, R, d, device, always=fold)
        self.grid = (m_tiles, n_kv * n_splits, n_groups)
        self.meta = (group_indptr, A, B, C, scale * LOG2E, chunk, n_kv, n_q, R)
        self.consts = dict(G=G, D=d, BLOCK_M=block_m, BLOCK_N=block_n, MODE=mode, PAGE=page, SPLIT=split,
                           num_warps=num_warps, num_stages=num_stages)

    def __call__(self, q, k_cache, v_cache, out, lse, extra=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`extra` (o2, lse2): merged into each row's result by the combine (a launch built with `fold`)."""
        if self.empty:
            return out, lse
        if extra is not None and self.combine is None:
            raise ValueError("extra state given to a launch built without fold")
        op, lsep = self.partials or (out, lse)
        _split_kv_kernel[self.grid](
            q, k_cache, v_cache, out, lse, op, lsep, *self.meta,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), **self.consts)
        if self.combine:
            self.combine(op, lsep, out, lse, extra)
        return out, lse


def default_scale(d: int, sm_scale: float | None) -> float:
    return 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
