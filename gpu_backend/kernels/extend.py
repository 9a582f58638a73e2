"""Prefill / extend: a chunk of new tokens of several requests (`qo_indptr`), each attending to
its whole cached prefix (slot lists, page table or slab) and causally to the chunk itself.

The chunk's own K/V come from `k_new`/`v_new` `[T, n_kv, d]` (the same tensors handed to
`write_kv`), so the launch does not depend on whether the write has happened yet. Rows are GQA
packed: row r of request i's tile is (new token r // G, q head h * G + r % G). No split along
KV: a chunk supplies M rows enough to fill the GPU except for tiny chunks over long prefixes,
where the engine should use `cascade_prefix_attention` over the prefix + this kernel over an
empty prefix + `merge_states`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks
from . import layout as L
from .common import LOG2E, attend, attend_full, finish, kv_span, slot_ids, stacked_queries, store_state
from .grid import cdiv
from .split_kv import default_scale


@triton.jit
def _extend_kernel(
    Q, KN, VN, K, V, O, LSE,          # Q, KN, VN, O [T, heads, D]; K, V [slots, n_kv, D]; LSE [T, n_q]
    QO_PTR, A, B, C,                  # QO_PTR [n_req + 1]; prefix storage (common.py)
    qk_scale, n_kv, n_q,
    stride_qt, stride_qh, stride_knt, stride_knh, stride_vnt, stride_vnh,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    G, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MODE: tl.constexpr, PAGE: tl.constexpr, ORDER: tl.constexpr,
):
    if ORDER == 2:  # row blocks major, heaviest (last) first across every request and head
        req = tl.program_id(0)
        h = tl.program_id(1)
        pid_m = tl.num_programs(2) - 1 - tl.program_id(2)
    else:  # requests in order; within each, row blocks in order (0) or heaviest first (1)
        pid_m = tl.program_id(0) if ORDER == 0 else tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
        req = tl.program_id(2)
    q_start = tl.load(QO_PTR + req)
    n_new = tl.load(QO_PTR + req + 1) - q_start
    n_rows = n_new * G
    if pid_m * BLOCK_M >= n_rows:
        return
    q, tok, qh, row_ok = stacked_queries(Q, q_start, n_rows, pid_m, h, G, stride_qt, stride_qh, BLOCK_M, D)
    i_new = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) // G                         # token index in chunk
    offs_d = tl.arange(0, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # 1. the cached prefix, whole: full tiles unmasked, then the tail
    base, length = kv_span(MODE, req, A, C)
    n_full = length // BLOCK_N
    for i in range(n_full):
        pos = i * BLOCK_N + tl.arange(0, BLOCK_N)
        slots = slot_ids(MODE, B, base, pos, pos < length, PAGE)
        k = tl.load(K + slots[:, None] * stride_kt + h * stride_kh + offs_d[None, :])
        v = tl.load(V + slots[:, None] * stride_vt + h * stride_vh + offs_d[None, :])
        m_i, l_i, acc = attend_full(q, k, v, m_i, l_i, acc, qk_scale)
    if n_full * BLOCK_N < length:
        pos = n_full * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = pos < length
        slots = slot_ids(MODE, B, base, pos, ok, PAGE)
        k = tl.load(K + slots[:, None] * stride_kt + h * stride_kh + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(V + slots[:, None] * stride_vt + h * stride_vh + offs_d[None, :], mask=ok[:, None], other=0.0)
        m_i, l_i, acc = attend(q, k, v, ok[None, :], m_i, l_i, acc, qk_scale)

    # 2. the chunk itself, causal: new token i sees new tokens j <= i. Tiles wholly at or before the tile's
    # first token are seen by every row (unmasked); the rest up to its last token are masked.
    i_first = (pid_m * BLOCK_M) // G
    j_full = (i_first + 1) // BLOCK_N
    for jb in range(j_full):
        jt = (q_start + jb * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        k = tl.load(KN + jt[:, None] * stride_knt + h * stride_knh + offs_d[None, :])
        v = tl.load(VN + jt[:, None] * stride_vnt + h * stride_vnh + offs_d[None, :])
        m_i, l_i, acc = attend_full(q, k, v, m_i, l_i, acc, qk_scale)
    j_hi = tl.minimum(n_new, ((pid_m + 1) * BLOCK_M - 1) // G + 1)
    for j0 in range(j_full * BLOCK_N, j_hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        ok = j < n_new
        jt = (q_start + j).to(tl.int64)
        k = tl.load(KN + jt[:, None] * stride_knt + h * stride_knh + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(VN + jt[:, None] * stride_vnt + h * stride_vnh + offs_d[None, :], mask=ok[:, None], other=0.0)
        causal = ok[None, :] & (j[None, :] <= i_new[:, None])
        m_i, l_i, acc = attend(q, k, v, causal, m_i, l_i, acc, qk_scale)
    o, lse = finish(m_i, l_i, acc)
    store_state(O, LSE, O, LSE, o, lse, tok, qh, row_ok, 0, n_q, 0, stride_ot, stride_oh, D, False)


# The order the grid's programs start in. A row block's work grows with its index (the causal chunk), so the
# last blocks of the longest request are the heaviest; run last, they leave the GPU's tail to a few programs.
ORDERS = {"in_order": 0,        # requests in order, each one's row blocks in order (the engine's launch)
          "heavy_first": 1,     # requests in order, each one's row blocks last to first
          "blocks_major": 2}    # row blocks last to first across every request and head


def default_tiles(rows: int) -> dict:
    """Tile, warps and pipeline depth for a launch whose longest chunk stacks ``rows`` query rows per KV head
    (chunk tokens x G). Measured (gpu_backend/bench/extend_tiles.py, reports/kernels/README.md): from 128 rows,
    128 x 128 tiles over 8 warps and 3 stages beat every other setting that fits at every point with a cached
    prefix (1.1-1.4x the 64 x 64 tiles on one H100); shorter chunks keep 64 x 64 tiles, which waste less of a
    tile's rows."""
    if rows >= 128:
        return dict(block_m=128, block_n=128, num_warps=8, num_stages=3)
    return dict(block_m=64, block_n=64, num_warps=4, num_stages=2)


class ExtendLaunch:
    """The extend launch with its host work done once: call it per layer with (q, k_new, v_new,
    k_cache, v_cache, out, lse). No checks: `extend_attention` checks. ``order``: a key of ORDERS."""

    def __init__(self, *, n_q: int, n_kv: int, d: int, qo_indptr: torch.Tensor, prefix: L.KVLayout,
                 max_qo_len: int, sm_scale: float | None = None, block_m: int | None = None,
                 block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                 order: str = "in_order"):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        G = n_q // n_kv
        given = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
        tiles = {**default_tiles(max_qo_len * G), **{k: v for k, v in given.items() if v is not None}}
        block_m, block_n, num_warps, num_stages = (tiles[k] for k in given)
        mode, A, B, C, page = L.kernel_args(prefix)
        n_m, n_req = max(1, cdiv(max_qo_len * G, block_m)), qo_indptr.shape[0] - 1
        self.grid = (n_req, n_kv, n_m) if order == "blocks_major" else (n_m, n_kv, n_req)
        self.meta = (qo_indptr, A, B, C, default_scale(d, sm_scale) * LOG2E, n_kv, n_q)
        self.consts = dict(G=G, D=d, BLOCK_M=block_m, BLOCK_N=block_n, MODE=mode, PAGE=page, ORDER=ORDERS[order],
                           num_warps=num_warps, num_stages=num_stages)

    def __call__(self, q, k_new, v_new, k_cache, v_cache, out, lse) -> None:
        _extend_kernel[self.grid](
            q, k_new, v_new, k_cache, v_cache, out, lse, *self.meta,
            q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
            k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
            out.stride(0), out.stride(1), **self.consts)


def extend_attention(
    *, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, qo_indptr: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, prefix: L.KVLayout,
    sm_scale: float | None = None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
    max_qo_len: int | None = None, check: bool = True,
    block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
    num_stages: int | None = None, order: str = "in_order",
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, n_q, d], k_new/v_new [T, n_kv, d]: request i's new tokens are rows
    qo_indptr[i]:qo_indptr[i+1]; its cached prefix is sequence i of `prefix` (may be empty).
    ``order``: the programs' start order (ORDERS; the same result in every order). Tiles not given follow
    `default_tiles`.
    Returns o [T, n_q, d], lse [T, n_q] fp32."""
    num_slots, n_kv, d = checks.kv_cache(k_cache, v_cache)
    dev = k_cache.device
    checks.queries("q", q, n_kv=n_kv, d=d, dtype=k_cache.dtype, device=dev)
    T, n_q, _ = q.shape
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        checks.tensor(name, t, dim=3, dtypes=(k_cache.dtype,), device=dev)
        if tuple(t.shape) != (T, n_kv, d):
            raise ValueError(f"{name} must be [{T}, {n_kv}, {d}], got {tuple(t.shape)}")
    n_req = qo_indptr.shape[0] - 1 if isinstance(qo_indptr, torch.Tensor) else None
    if check:
        L.check_indptr("qo_indptr", qo_indptr, None, T, dev)
        L.validate(prefix, n=n_req, num_slots=num_slots, device=dev, name="prefix")
    elif L.num_seqs(prefix) != n_req:
        raise ValueError(f"prefix describes {L.num_seqs(prefix)} sequences, qo_indptr {n_req}")
    out = checks.out_tensor("out", out, (T, n_q, d), q.dtype, dev)
    lse = checks.out_tensor("lse", lse, (T, n_q), torch.float32, dev)
    if T == 0 or n_req == 0:
        return out, lse
    if max_qo_len is None:
        p = qo_indptr.cpu().long()
        max_qo_len = int((p[1:] - p[:-1]).max())
    launch = ExtendLaunch(n_q=n_q, n_kv=n_kv, d=d, qo_indptr=qo_indptr, prefix=prefix, max_qo_len=max_qo_len,
                          sm_scale=sm_scale, block_m=block_m, block_n=block_n, num_warps=num_warps,
                          num_stages=num_stages, order=order)
    launch(q, k_new, v_new, k_cache, v_cache, out, lse)
    return out, lse
