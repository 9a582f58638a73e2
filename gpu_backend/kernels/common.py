"""`@triton.jit` helpers shared by the attention kernels.

Storage encoding (see gpu_backend/layout.py): MODE 0 = slot lists (A = indptr, B = slot ids),
1 = page table (A = page indptr, B = page ids, C = lens, PAGE = page size),
2 = slab (A = start, C = length). Scores are kept in the log2 domain
(`qk_scale = sm_scale * log2(e)`); the LSE handed out is natural-log.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def kv_span(MODE: tl.constexpr, seq, A, C):
    """(base, length) of sequence `seq`: base indexes B (modes 0, 1) or is the first slot (2)."""
    base = tl.load(A + seq)
    if MODE == 0:
        length = tl.load(A + seq + 1) - base
    else:
        length = tl.load(C + seq)
    return base, length


@triton.jit
def slot_ids(MODE: tl.constexpr, B, base, pos, mask, PAGE: tl.constexpr):
    """int64 slot ids of token positions `pos` (masked lanes give slot 0, never read)."""
    if MODE == 0:
        slots = tl.load(B + base + pos, mask=mask, other=0)
    elif MODE == 1:
        page = tl.load(B + base + pos // PAGE, mask=mask, other=0)
        slots = page * PAGE + pos % PAGE
    else:
        slots = tl.where(mask, base + pos, 0)
    return slots.to(tl.int64)


@triton.jit
def _online_softmax(s, qk_scale, v, m_i, l_i, acc):
    """Fold one block of raw scores s = q.k [M, N] and values v [N, D] into the running state (log2 domain).
    The scale goes into the exponent's one multiply-add (the maximum of the raw scores, scaled, is the maximum
    of the scaled ones: the scale is positive), and P.V accumulates straight onto the rescaled state."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def attend(q, k, v, mask, m_i, l_i, acc, qk_scale):
    """One online-softmax step. q [M, D], k/v [N, D], mask [M, N] or [1, N] (True = attend)."""
    s = tl.where(mask, tl.dot(q, tl.trans(k)), float("-inf"))
    return _online_softmax(s, qk_scale, v, m_i, l_i, acc)


@triton.jit
def attend_full(q, k, v, m_i, l_i, acc, qk_scale):
    """`attend` for a block every row may see whole (no mask work)."""
    return _online_softmax(tl.dot(q, tl.trans(k)), qk_scale, v, m_i, l_i, acc)


@triton.jit
def finish(m_i, l_i, acc):
    """(o fp32 [M, D], lse natural-log [M]); rows that saw no key give o = 0, lse = -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    return o, lse


@triton.jit
def group_program(GROUP_PTR, n_kv, G):
    """This program's place in a prefix-pass grid (M tiles, n_kv x splits, groups): (KV head, split,
    group, the group's first query token, its stacked rows = members x G)."""
    pid_hs = tl.program_id(1)
    g = tl.program_id(2)
    q_start = tl.load(GROUP_PTR + g)
    n_rows = (tl.load(GROUP_PTR + g + 1) - q_start) * G
    return pid_hs % n_kv, pid_hs // n_kv, g, q_start, n_rows


@triton.jit
def stacked_queries(Q, q_start, n_rows, pid_m, h, G, stride_qt, stride_qh,
                    BLOCK_M: tl.constexpr, D: tl.constexpr):
    """Tile pid_m of a group's stacked rows (row r = b * G + g: query token q_start + b, head h * G + g):
    (q [BLOCK_M, D], query token int64, query head, valid)."""
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = r < n_rows
    tok = (q_start + r // G).to(tl.int64)
    qh = h * G + r % G
    offs_d = tl.arange(0, D)
    q = tl.load(Q + tok[:, None] * stride_qt + qh[:, None] * stride_qh + offs_d[None, :],
                mask=valid[:, None], other=0.0)
    return q, tok, qh, valid


@triton.jit
def store_state(O, LSE, OP, LSEP, o, lse, tok, qh, row_ok, s, n_q, n_rows_total, stride_ot, stride_oh,
                D: tl.constexpr, SPLIT: tl.constexpr):
    """Write a tile's (o, lse): to O/LSE, or as split s's fp32 partial to OP/LSEP (see split_kv.Combine)."""
    offs_d = tl.arange(0, D)
    row = tok * n_q + qh                                                           # flat (token, head)
    if SPLIT:
        tl.store(OP + (s * n_rows_total + row)[:, None] * D + offs_d[None, :], o, mask=row_ok[:, None])
        tl.store(LSEP + s * n_rows_total + row, lse, mask=row_ok)
    else:
        tl.store(O + tok[:, None] * stride_ot + qh[:, None] * stride_oh + offs_d[None, :],
                 o.to(O.dtype.element_ty), mask=row_ok[:, None])
        tl.store(LSE + row, lse, mask=row_ok)
