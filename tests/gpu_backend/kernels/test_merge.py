"""The LSE merge, and the three decode paths of DESIGN.md section 4 agreeing end to end:
paged (whole context per request), cascade (prefix pass + suffix decode + merge) and dense."""
import pytest
import torch

from gb_util import DEV, close, i32, poisoned, queries, tokens
from gpu_backend.kernels import layout as L
from gpu_backend.kernels import reference as R
from gpu_backend.kernels.cascade import cascade_launch, cascade_prefix_attention
from gpu_backend.kernels.decode import decode_attention
from gpu_backend.kernels.dense import DenseLaunch, dense_prefix_attention
from gpu_backend.kernels.merge import merge_states


def states(shape, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(*shape, d, generator=g).to(dtype).to(DEV)
    lse = (torch.randn(*shape, generator=g) * 4).to(DEV)
    return o, lse


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_merge_matches_reference(dtype):
    o1, l1 = states((5, 3), 64, dtype, 1)
    o2, l2 = states((5, 3), 64, torch.float32, 2)
    l1[0, 0] = l2[0, 0] = float("-inf")   # both absent
    l1[1, 2] = float("-inf")              # empty prefix
    l2[3, 1] = float("-inf")              # empty suffix
    o2[3, 1] = float("nan")               # an absent state's o must not leak into the result
    out, out_lse = poisoned((5, 3, 64), dtype), poisoned((5, 3), torch.float32)
    o, l = merge_states(o1=o1, lse1=l1, o2=o2, lse2=l2, out=out, out_lse=out_lse)
    ro, rl = R.merge(o1, l1, o2.nan_to_num(0.0), l2)
    close(o, l, ro, rl, dtype, "merge")
    assert (o[1, 2].float() - o2[1, 2]).abs().max() < 1e-3   # empty prefix: the suffix state
    assert (o[3, 1].float() - o1[3, 1].float()).abs().max() < 1e-3  # empty suffix: the prefix state


def test_merge_in_place_and_errors():
    o1, l1 = states((4, 8), 128, torch.float32, 3)
    o2, l2 = states((4, 8), 128, torch.float32, 4)
    ro, rl = R.merge(o1, l1, o2, l2)
    o, l = merge_states(o1=o1, lse1=l1, o2=o2, lse2=l2, out=o1)
    assert o is o1
    close(o, l, ro, rl, torch.float32, "in place")
    with pytest.raises(ValueError, match="o2 shape"):
        merge_states(o1=o1, lse1=l1, o2=o2[:2], lse2=l2)
    with pytest.raises(ValueError, match="lse2 has dtype"):
        merge_states(o1=o1, lse1=l1, o2=o2, lse2=l2.double())


@pytest.mark.parametrize("prefix_kind", ["slots", "pages16", "slab"])
@pytest.mark.parametrize("G,d", [(4, 64), (5, 128)])
def test_paths_agree(prefix_kind, G, d):
    """Two prefix groups (3 and 2 requests), suffixes of 5, 0, 17, 1, 0 tokens."""
    dtype, n_kv = torch.float16, 1
    pre_len, suf_len = [70, 1], [5, 0, 17, 1, 0]
    pk, pv = tokens(pre_len, n_kv, d, dtype, seed=1)
    sk, sv = tokens(suf_len, n_kv, d, dtype, seed=2)
    # one cache: prefixes at [0, 96) in the chosen storage (pages of 16), suffixes above, scattered
    P, S = 96, 40
    g = torch.Generator().manual_seed(G)
    kc = torch.randn(P + S, n_kv, d, generator=g).to(dtype).to(DEV)
    vc = torch.randn(P + S, n_kv, d, generator=g).to(dtype).to(DEV)
    pages = torch.randperm(P // 16, generator=g)
    pre_slots = [pages[0] * 16 + torch.arange(16), pages[1] * 16 + torch.arange(16),
                 pages[2] * 16 + torch.arange(16), pages[3] * 16 + torch.arange(16),
                 pages[4] * 16 + torch.arange(16)]
    pre_slots = [torch.cat(pre_slots)[:70], pages[5] * 16 + torch.arange(1)]
    if prefix_kind == "slab":
        pre_slots = [torch.arange(3, 73), torch.arange(80, 81)]
        prefix = L.Slabs(i32([3, 80]), i32(pre_len))
    elif prefix_kind == "pages16":
        prefix = L.PageTable(i32([0, 5, 6]), i32(pages[:6].tolist()), i32(pre_len), 16)
    else:
        prefix = L.SlotLists(i32([0, 70, 71]), i32(torch.cat(pre_slots)))
    perm = P + torch.randperm(S, generator=g)
    suf_slots, at = [], 0
    for n in suf_len:
        suf_slots.append(perm[at:at + n])
        at += n
    for sl, k, v in list(zip(pre_slots, pk, pv)) + list(zip(suf_slots, sk, sv)):
        kc[sl.to(DEV)], vc[sl.to(DEV)] = k.to(DEV), v.to(DEV)
    suffix = L.SlotLists(i32([0, 5, 5, 22, 23, 23]), i32(torch.cat(suf_slots)))
    group_of = [0, 0, 0, 1, 1]
    full = [torch.cat([pre_slots[group_of[b]], suf_slots[b]]) for b in range(5)]
    full_kv = L.SlotLists(i32([0] + torch.tensor([len(f) for f in full]).cumsum(0).tolist()),
                          i32(torch.cat(full)))
    q = queries(5, n_kv * G, d, dtype, seed=G)
    gp = i32([0, 3, 5])
    ref = R.decode(q, kc, vc, full_kv)

    def decode(kv, **kw):
        return decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, out=poisoned(q.shape, dtype),
                                lse=poisoned(q.shape[:2], torch.float32), **kw)

    paged = decode(full_kv, kv_chunk=64)
    close(*paged, *ref, dtype, "paged")
    suf = decode(suffix)
    cas = cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=prefix,
                                   kv_chunk=64, out=poisoned(q.shape, dtype))
    cascade = merge_states(o1=cas[0], lse1=cas[1], o2=suf[0], lse2=suf[1], out=poisoned(q.shape, dtype))
    close(*cascade, *ref, dtype, "cascade")
    if prefix_kind == "slab":
        den = dense_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=prefix,
                                     block_m=16, block_n=32)
        dense = merge_states(o1=den[0], lse1=den[1], o2=suf[0], lse2=suf[1])
        close(*dense, *ref, dtype, "dense")
        assert (dense[0].float() - cascade[0].float()).abs().max() < 4e-3
    assert (paged[0].float() - cascade[0].float()).abs().max() < 4e-3

    # the merge folded into the prefix pass's combine (the engine's fold_merge), split and unsplit; a row without
    # suffix (lse -inf) must not read its o, even NaN
    suf_o = suf[0].clone()
    suf_o[torch.isinf(suf[1])] = float("nan")
    common = dict(rows=5, n_q=n_kv * G, n_kv=n_kv, d=d, group_indptr=gp, prefix=prefix, max_group_size=3,
                  max_kv_len=70, device=q.device, fold=True)
    launches = {f"cascade, kv_chunk {c}": cascade_launch(**common, kv_chunk=c) for c in (64, None)}
    if prefix_kind == "slab":
        launches["dense"] = DenseLaunch(**common, block_m=16, block_n=32)
    for name, launch in launches.items():
        folded = launch(q, kc, vc, poisoned(q.shape, dtype), poisoned(q.shape[:2], torch.float32), (suf_o, suf[1]))
        close(*folded, *ref, dtype, f"{name}, merge folded")
    with pytest.raises(ValueError, match="without fold"):  # unsplit: no combine to fold the state into
        cascade_launch(**{**common, "fold": False}, kv_chunk=128)(q, kc, vc, poisoned(q.shape, dtype),
                                                                 poisoned(q.shape[:2], torch.float32), suf)
