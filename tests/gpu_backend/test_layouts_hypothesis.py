"""Hypothesis-drawn KV layouts: (1) random slot permutations / page tables / slabs drawn here;
(2) layouts produced by the real allocator `granisim.kv` (granikv, token, paged16 policies).
Every path must agree with the float64 reference and with the others."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gb_util import DEV, STORAGES, close, i32, poisoned, queries, stored
from gpu_backend.kernels import layout as L
from gpu_backend.kernels import reference as R
from gpu_backend.kernels.cascade import cascade_prefix_attention
from gpu_backend.kernels.decode import decode_attention
from gpu_backend.kernels.dense import dense_prefix_attention
from gpu_backend.kernels.merge import merge_states

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
F16 = torch.float16


@SETTINGS
@given(kind=st.sampled_from(STORAGES), lens=st.lists(st.integers(0, 90), min_size=1, max_size=4),
       G=st.sampled_from([1, 4, 5, 8]), chunk=st.sampled_from([64, 128, None]), seed=st.integers(0, 999))
def test_decode_drawn_layouts(kind, lens, G, chunk, seed):
    kc, vc, kv = stored(kind, lens, 1, 64, F16, seed=seed)
    q = queries(len(lens), G, 64, F16, seed=seed)
    o, lse = decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, kv_chunk=chunk,
                              out=poisoned(q.shape, F16), lse=poisoned(q.shape[:2], torch.float32))
    close(o, lse, *R.decode(q, kc, vc, kv), F16, kind)


@SETTINGS
@given(kind=st.sampled_from(STORAGES), groups=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 90)),
                                                        min_size=1, max_size=3),
       G=st.sampled_from([1, 4, 5]), seed=st.integers(0, 999))
def test_cascade_drawn_layouts(kind, groups, G, seed):
    rows = [r for r, _ in groups]
    lens = [n for _, n in groups]
    kc, vc, pre = stored(kind, lens, 1, 64, F16, seed=seed)
    q = queries(sum(rows), G, 64, F16, seed=seed)
    gp = i32(np.concatenate([[0], np.cumsum(rows)]))
    ref = R.grouped(q, kc, vc, gp, pre)
    o, lse = cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=pre, kv_chunk=64,
                                      out=poisoned(q.shape, F16), lse=poisoned(q.shape[:2], torch.float32))
    close(o, lse, *ref, F16, "cascade " + kind)
    if kind == "slab":
        close(*dense_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=pre,
                                      block_m=16, block_n=32), *ref, F16, "dense")


# ---- layouts from the real allocator -------------------------------------------------------

kvmod = pytest.importorskip("granisim.kv")


def _as_pages(slots: np.ndarray, ps: int):
    """Page ids of a paged request's slots (checks they are whole pages, in order)."""
    pages = slots[::ps] // ps
    expect = (pages[np.arange(slots.size) // ps] * ps + np.arange(slots.size) % ps)
    assert np.array_equal(expect, slots), "paged allocator gave slots that are not page runs"
    return pages


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["granikv", "token", "paged16"]),
       roles=st.lists(st.tuples(st.integers(1, 80), st.lists(st.integers(1, 12), min_size=1, max_size=3)),
                      min_size=1, max_size=2),
       G=st.sampled_from([1, 4, 5]), seed=st.integers(0, 999))
def test_allocator_layouts_all_paths_agree(policy, roles, G, seed):
    rng = np.random.default_rng(seed)
    cap = 800
    alloc = kvmod.make_allocator(policy, cap, hot_fraction=0.5)
    rid, rids = 0, []
    for plen, suffixes in roles:
        prompt = rng.integers(0, 50_000, plen)
        for slen in suffixes:
            toks = np.concatenate([prompt, rng.integers(0, 50_000, slen)])
            cached = alloc.admit(rid, toks, shared_len=plen)
            alloc.extend(rid, toks.size - cached)
            alloc.cache_prefix(rid, prompt)
            rids.append(rid)
            rid += 1
    lays = sorted((alloc.layout(r) for r in rids), key=lambda lay: (lay.group is None, lay.group, lay.rid))
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(cap, 1, 64, generator=g).half().to(DEV)   # every slot random: content is whatever
    vc = torch.randn(cap, 1, 64, generator=g).half().to(DEV)   # the allocator's slots hold
    B = len(lays)
    q = queries(B, G, 64, F16, seed=seed)

    def csr(lists):
        lists = [np.asarray(x, np.int64) for x in lists]
        return L.SlotLists(i32(np.concatenate([[0], np.cumsum([x.size for x in lists])])),
                           i32(np.concatenate(lists) if lists else []))

    full = [lay.slots() for lay in lays]
    if policy == "paged16":
        pages = [_as_pages(s, 16) for s in full]
        paged_kv = L.PageTable(i32(np.concatenate([[0], np.cumsum([p.size for p in pages])])),
                               i32(np.concatenate(pages)), i32([s.size for s in full]), 16)
    else:
        paged_kv = csr(full)
    ref = R.decode(q, kc, vc, csr(full))
    paged = decode_attention(q=q, k_cache=kc, v_cache=vc, kv=paged_kv, kv_chunk=64,
                             out=poisoned(q.shape, F16), lse=poisoned(q.shape[:2], torch.float32))
    close(*paged, *ref, F16, f"paged {policy}")

    # prefix groups: consecutive requests with the same radix group share their first shared_len slots
    keys = [(lay.group, lay.shared_len) if lay.group is not None else ("solo", lay.rid) for lay in lays]
    bounds = [0] + [i for i in range(1, B) if keys[i] != keys[i - 1]] + [B]
    shared = [lays[a].shared_slots() for a in bounds[:-1]]
    for a, b in zip(bounds[:-1], bounds[1:]):
        for lay in lays[a:b]:
            assert np.array_equal(lay.shared_slots(), shared[bounds.index(a)])
    gp = i32(bounds)
    slabs = [lays[a].segments[0].slab for a in bounds[:-1]]
    use_slab = policy == "granikv" and all(
        s is not None and sh.size and s[1] >= sh.size and np.array_equal(sh, np.arange(s[0], s[0] + sh.size))
        for s, sh in zip(slabs, shared))
    prefix = (L.Slabs(i32([s[0] for s in slabs]), i32([sh.size for sh in shared])) if use_slab
              else csr(shared))
    event(f"{policy}: prefix as {type(prefix).__name__}, {len(shared)} groups")
    suffix = csr([lay.private_slots() for lay in lays])
    suf = decode_attention(q=q, k_cache=kc, v_cache=vc, kv=suffix)
    cas = cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=prefix, kv_chunk=64)
    close(*merge_states(o1=cas[0], lse1=cas[1], o2=suf[0], lse2=suf[1], out=poisoned(q.shape, F16)),
          *ref, F16, f"cascade {policy}")
    if use_slab:
        den = dense_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=prefix,
                                     block_m=16, block_n=32)
        close(*merge_states(o1=den[0], lse1=den[1], o2=suf[0], lse2=suf[1]), *ref, F16, "dense")
