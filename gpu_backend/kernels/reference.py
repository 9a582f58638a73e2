"""Torch references for every kernel: gather the slots, softmax in float64, on the CPU.

Slow and obviously right; the tests and the GPU checks compare the kernels against these.
"""
from __future__ import annotations

import math

import torch

from . import layout as L


def slots_of(kv: L.KVLayout, i: int) -> torch.Tensor:
    """Slot ids (int64, CPU, token order) of sequence i."""
    if isinstance(kv, L.SlotLists):
        p = kv.indptr.cpu().long()
        return kv.indices.cpu().long()[p[i]:p[i + 1]]
    if isinstance(kv, L.PageTable):
        p = kv.indptr.cpu().long()
        n = int(kv.lens.cpu()[i])
        pages = kv.indices.cpu().long()[p[i]:p[i + 1]]
        pos = torch.arange(n)
        return pages[pos // kv.page_size] * kv.page_size + pos % kv.page_size
    if isinstance(kv, L.Slabs):
        s, n = int(kv.start.cpu()[i]), int(kv.length.cpu()[i])
        return torch.arange(s, s + n)
    raise TypeError(type(kv).__name__)


def attention(q, k, v, sm_scale: float, causal_from: int | None = None):
    """q [M, n_q, d]; k, v [N, n_kv, d]. Query m sees keys j <= causal_from + m (all when None).

    Returns o [M, n_q, d] float64 and lse [M, n_q] float64 (natural log); no keys -> 0, -inf.
    """
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    M, n_q, d = q.shape
    G = n_q // k.shape[1]
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q, k) * sm_scale
    if causal_from is not None:
        allow = torch.arange(k.shape[0])[None, :] <= causal_from + torch.arange(M)[:, None]
        s = s.masked_fill(~allow[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                          # [h, M]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    o = torch.einsum("hmn,nhd->mhd", p, v)
    return o, lse.transpose(0, 1).contiguous()


def _scale(d, sm_scale):
    return 1.0 / math.sqrt(d) if sm_scale is None else sm_scale


def _start(q, indptr, k_cache, v_cache):
    """Empty outputs (float64, lse -inf) for q's rows, the row pointer and the caches, on the CPU."""
    T, n_q, d = q.shape
    o = torch.zeros(T, n_q, d, dtype=torch.float64)
    lse = torch.full((T, n_q), float("-inf"), dtype=torch.float64)
    return o, lse, indptr.cpu().long(), k_cache.cpu(), v_cache.cpu()


def grouped(q, k_cache, v_cache, group_indptr, kv: L.KVLayout, sm_scale=None):
    """Cascade/dense reference: rows group_indptr[g]:group_indptr[g+1] of q over sequence g."""
    o, lse, p, kc, vc = _start(q, group_indptr, k_cache, v_cache)
    d = q.shape[-1]
    for g in range(p.shape[0] - 1):
        a, b = int(p[g]), int(p[g + 1])
        sl = slots_of(kv, g)
        if b > a and sl.numel():
            o[a:b], lse[a:b] = attention(q[a:b], kc[sl], vc[sl], _scale(d, sm_scale))
    return o, lse


def decode(q, k_cache, v_cache, kv: L.KVLayout, sm_scale=None):
    """One query per sequence."""
    gptr = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return grouped(q, k_cache, v_cache, gptr, kv, sm_scale)


def extend(q, k_new, v_new, qo_indptr, k_cache, v_cache, prefix: L.KVLayout, sm_scale=None):
    """Request r's new tokens q[a:b] see its cached prefix and new tokens j <= i (causal)."""
    o, lse, p, kc, vc = _start(q, qo_indptr, k_cache, v_cache)
    d = q.shape[-1]
    for r in range(p.shape[0] - 1):
        a, b = int(p[r]), int(p[r + 1])
        if b == a:
            continue
        sl = slots_of(prefix, r)
        k = torch.cat([kc[sl], k_new[a:b].cpu()])
        v = torch.cat([vc[sl], v_new[a:b].cpu()])
        o[a:b], lse[a:b] = attention(q[a:b], k, v, _scale(d, sm_scale), causal_from=sl.numel())
    return o, lse


def merge(o1, lse1, o2, lse2):
    """LSE merge in float64; an absent state has lse = -inf."""
    o1, o2 = o1.cpu().double(), o2.cpu().double()
    lse1, lse2 = lse1.cpu().double(), lse2.cpu().double()
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    tot = w1 + w2
    safe = torch.where(tot == 0, torch.ones_like(tot), tot)
    o = (o1 * w1[..., None] + o2 * w2[..., None]) / safe[..., None]
    lse = torch.where(tot == 0, torch.full_like(tot, float("-inf")), m + torch.log(safe))
    return o, lse


def kv_write(k_cache, v_cache, k, v, slots):
    """Copies of the caches with rows `slots` replaced by k, v."""
    kc, vc = k_cache.cpu().clone(), v_cache.cpu().clone()
    idx = slots.cpu().long()
    kc[idx] = k.cpu()
    vc[idx] = v.cpu()
    return kc, vc
