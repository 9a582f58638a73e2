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
def attend(q, k, v, mask, m_i, l_i, acc, qk_scale):
    """One online-softmax step. q [M, D], k/v [N, D], mask [M, N] or [1, N] (True = attend)."""
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    qk = tl.where(mask, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def finish(m_i, l_i, acc):
    """(o fp32 [M, D], lse natural-log [M]); rows that saw no key give o = 0, lse = -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    return o, lse


@triton.jit
def stacked_rows(r, n_rows, q_start, h, G):
    """Stacked row r of a group -> (query token, query head, valid). Row r = b * G + g."""
    valid = r < n_rows
    tok = q_start + r // G
    qh = h * G + r % G
    return tok, qh, valid


@triton.jit
def attend_full(q, k, v, m_i, l_i, acc, qk_scale):
    """`attend` for a block every row may see whole (no mask work)."""
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
