"""Decode attention over slot lists, page tables (1, 16) and slabs, against the float64
reference and against each other. CPU: interpreter, small shapes; GPU tests in test_gpu_sizes.py."""
import pytest
import torch

from gb_util import CUDA, DEV, STORAGES, close, poisoned, queries, stored
from gpu_backend.kernels import layout as L
from gpu_backend.kernels import reference as R
from gpu_backend.kernels.decode import decode_attention

# (G, head_dim, n_kv): G in {1, 4, 5, 8}, d in {64, 128}
SHAPES = [(1, 64, 2), (4, 128, 1), (5, 64, 2), (8, 128, 1)]
LENS = [37, 0, 1, 130]  # not tile multiples, an empty and a one-token sequence


def run(q, kc, vc, kv, **kw):
    B, n_q, d = q.shape
    out, lse = poisoned((B, n_q, d), q.dtype), poisoned((B, n_q), torch.float32)
    o, l = decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, out=out, lse=lse, **kw)
    assert o is out and l is lse
    return o, l


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("G,d,n_kv", SHAPES)
@pytest.mark.parametrize("kind", STORAGES)
def test_decode_matches_reference(kind, G, d, n_kv, dtype):
    kc, vc, kv = stored(kind, LENS, n_kv, d, dtype, seed=G + d)
    q = queries(len(LENS), n_kv * G, d, dtype, seed=G)
    ref = R.decode(q, kc, vc, kv)
    close(*run(q, kc, vc, kv, kv_chunk=64), *ref, dtype, f"{kind} split")
    close(*run(q, kc, vc, kv, kv_chunk=192), *ref, dtype, f"{kind} chunk 192")


@pytest.mark.parametrize("G,d,n_kv", [(4, 64, 2), (5, 128, 1)])
def test_storages_agree_exactly(G, d, n_kv):
    """The same tokens in any storage give bit-identical results (same tiles, same order)."""
    dtype = torch.float16
    q = queries(len(LENS), n_kv * G, d, dtype, seed=3)
    res = {k: run(q, *stored(k, LENS, n_kv, d, dtype, seed=3), kv_chunk=64) for k in STORAGES}
    for k in STORAGES[1:]:
        assert torch.equal(res[k][0], res["slots"][0]), k
        assert torch.equal(res[k][1], res["slots"][1]), k


def test_split_and_unsplit_agree():
    dtype = torch.float32
    kc, vc, kv = stored("pages16", [200, 3, 65], 2, 64, dtype, seed=5)
    q = queries(3, 8, 64, dtype, seed=5)
    a = run(q, kc, vc, kv, kv_chunk=64)
    b = run(q, kc, vc, kv, kv_chunk=256)          # one split: no combine pass
    c = run(q, kc, vc, kv)                         # launcher's own choice
    tol = 2e-4 if CUDA else 1e-5  # tf32 dots on a GPU round each split's partial sums apart (8.5e-5 on an H200)
    for x in (b, c):
        assert (x[0] - a[0]).abs().max() < tol and (x[1] - a[1]).abs().max() < tol


def test_all_empty():
    kc, vc, kv = stored("slots", [0, 0], 1, 64, torch.float16, seed=1)
    q = queries(2, 4, 64, torch.float16, seed=1)
    o, l = run(q, kc, vc, kv)
    assert (o == 0).all() and torch.isinf(l).all() and (l < 0).all()


def test_sm_scale_and_strided_q():
    """Non-default scale, q a strided view (heads of a packed qkv tensor)."""
    dtype = torch.float32
    kc, vc, kv = stored("slots", [50, 9], 2, 64, dtype, seed=2)
    qkv = queries(2, 8 + 4, 64, dtype, seed=2)
    q = qkv[:, :8]
    ref = R.decode(q, kc, vc, kv, sm_scale=0.3)
    close(*run(q, kc, vc, kv, sm_scale=0.3, kv_chunk=64), *ref, dtype, "strided q")


def _base(kind="slots"):
    kc, vc, kv = stored(kind, [10, 5], 2, 64, torch.float16, seed=0)
    return queries(2, 8, 64, torch.float16, seed=0), kc, vc, kv


def test_rejects_out_of_range_slot():
    q, kc, vc, kv = _base()
    bad = kv.indices.clone()
    bad[7] = kc.shape[0]
    with pytest.raises(ValueError, match=rf"kv.indices\[7\] = {kc.shape[0]} is not a slot id"):
        decode_attention(q=q, k_cache=kc, v_cache=vc, kv=L.SlotLists(kv.indptr, bad))
    bad[7] = -1
    with pytest.raises(ValueError, match=r"kv.indices\[7\] = -1"):
        decode_attention(q=q, k_cache=kc, v_cache=vc, kv=L.SlotLists(kv.indptr, bad))


def test_rejects_bad_page_table():
    q, kc, vc, kv = _base("pages16")
    bad = kv.indices.clone()
    bad[0] = kc.shape[0] // 16
    with pytest.raises(ValueError, match=r"kv.indices\[0\] = \d+ is not a page id"):
        decode_attention(q=q, k_cache=kc, v_cache=vc, kv=L.PageTable(kv.indptr, bad, kv.lens, 16))
    lens = kv.lens.clone()
    lens[1] = 17  # one page holds 16
    with pytest.raises(ValueError, match=r"kv.lens\[1\] = 17"):
        decode_attention(q=q, k_cache=kc, v_cache=vc, kv=L.PageTable(kv.indptr, kv.indices, lens, 16))


def test_rejects_bad_slab_and_shapes():
    q, kc, vc, kv = _base("slab")
    start = kv.start.clone()
    start[1] = kc.shape[0] - 2
    with pytest.raises(ValueError, match=r"kv.start\[1\] = \d+ \+ its length runs past"):
        decode_attention(q=q, k_cache=kc, v_cache=vc, kv=L.Slabs(start, kv.length))
    with pytest.raises(ValueError, match="q has dtype"):
        decode_attention(q=q.float(), k_cache=kc, v_cache=vc, kv=kv)
    with pytest.raises(ValueError, match="not a multiple of n_kv_heads"):
        decode_attention(q=q[:, :3], k_cache=kc, v_cache=vc, kv=kv)
    with pytest.raises(ValueError, match="must be int32"):
        decode_attention(q=q, k_cache=kc, v_cache=vc, kv=L.Slabs(kv.start.long(), kv.length))
    with pytest.raises(ValueError, match="must have 6 entries, got 2"):
        decode_attention(q=torch.cat([q, q, q]), k_cache=kc, v_cache=vc, kv=kv)
    with pytest.raises(ValueError, match="out must have shape"):
        decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv,
                         out=torch.empty(3, 8, 64, dtype=q.dtype, device=DEV))
