"""Cascade prefix pass (stacked group queries, split along KV, one launch for all groups) and the
dense prefix pass (slabs, 128-row tiles, block pointers or TMA), against the reference."""
import pytest
import torch

from gb_util import STORAGES, close, i32, poisoned, queries, stored
from gpu_backend.kernels import layout as L
from gpu_backend.kernels import reference as R
from gpu_backend.kernels.cascade import cascade_prefix_attention
from gpu_backend.kernels.dense import dense_prefix_attention

SHAPES = [(1, 64, 2), (4, 128, 1), (5, 64, 2), (8, 128, 1)]
ROWS = [3, 1, 0, 6]            # queries per group: an empty group too
PREFIX = [40, 1, 25, 129]      # one-token prefix, lengths off the tile grid


def gptr(rows):
    p = [0]
    for r in rows:
        p.append(p[-1] + r)
    return i32(p)


def run(fn, q, kc, vc, gp, pre, **kw):
    T, n_q, d = q.shape
    out, lse = poisoned((T, n_q, d), q.dtype), poisoned((T, n_q), torch.float32)
    return fn(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=pre, out=out, lse=lse, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("G,d,n_kv", SHAPES)
@pytest.mark.parametrize("kind", STORAGES)
def test_cascade_matches_reference(kind, G, d, n_kv, dtype):
    kc, vc, pre = stored(kind, PREFIX, n_kv, d, dtype, seed=G)
    q = queries(sum(ROWS), n_kv * G, d, dtype, seed=d)
    gp = gptr(ROWS)
    ref = R.grouped(q, kc, vc, gp, pre)
    # block_m 16 -> several row tiles per group; kv_chunk 64 -> several splits
    close(*run(cascade_prefix_attention, q, kc, vc, gp, pre, block_m=16, kv_chunk=64), *ref, dtype, kind)
    close(*run(cascade_prefix_attention, q, kc, vc, gp, pre), *ref, dtype, kind + " auto")


@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("G,d,n_kv", [(4, 64, 2), (5, 128, 1), (8, 64, 1)])
def test_dense_matches_reference_and_cascade(G, d, n_kv, use_tma):
    dtype = torch.float16
    kc, vc, pre = stored("slab", PREFIX, n_kv, d, dtype, seed=G)
    q = queries(sum(ROWS), n_kv * G, d, dtype, seed=d)
    gp = gptr(ROWS)
    ref = R.grouped(q, kc, vc, gp, pre)
    # small tiles keep the interpreter quick; tails and splits still exercised
    a = run(dense_prefix_attention, q, kc, vc, gp, pre, block_m=16, block_n=32, kv_chunk=64, use_tma=use_tma)
    close(*a, *ref, dtype, "dense split")
    b = run(dense_prefix_attention, q, kc, vc, gp, pre, block_m=32, block_n=16, use_tma=use_tma)
    close(*b, *ref, dtype, "dense")
    c = run(cascade_prefix_attention, q, kc, vc, gp, pre)
    assert (a[0].float() - c[0].float()).abs().max() < 4e-3
    assert (b[1] - c[1]).abs().max() < 1e-3


def test_dense_needs_slabs():
    kc, vc, pre = stored("slots", [5], 1, 64, torch.float16, seed=0)
    q = queries(2, 4, 64, torch.float16, seed=0)
    with pytest.raises(TypeError, match="prefix must be Slabs"):
        dense_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gptr([2]), prefix=pre)


def test_cascade_rejects_bad_groups():
    kc, vc, pre = stored("slab", [5, 6], 1, 64, torch.float16, seed=0)
    q = queries(4, 4, 64, torch.float16, seed=0)
    with pytest.raises(ValueError, match=r"group_indptr\[-1\] = 3, must equal 4"):
        cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=i32([0, 1, 3]), prefix=pre)
    with pytest.raises(ValueError, match=r"group_indptr\[2\] = 1 is smaller"):
        cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=i32([0, 3, 1, 4]),
                                 prefix=L.Slabs(i32([0, 0, 0]), i32([1, 1, 1])))
    with pytest.raises(ValueError, match=r"prefix.length\[0\] = -1 is negative"):
        cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=i32([0, 1, 4]),
                                 prefix=L.Slabs(i32([0, 0]), i32([-1, 1])))


@pytest.mark.parametrize("kind", STORAGES)
def test_cascade_128_row_tiles_match_reference(kind):
    """128-row tiles take whole K/V tiles unmasked (split_kv): splits of whole tiles and a tail, prefixes off the
    tile grid, a group of two row tiles (d = 16 keeps the interpreter quick)."""
    dtype, G, d, n_kv, rows, prefix = torch.float32, 4, 16, 1, [40, 3], [150, 77]
    kc, vc, pre = stored(kind, prefix, n_kv, d, dtype, seed=11)
    q = queries(sum(rows), n_kv * G, d, dtype, seed=12)
    gp = gptr(rows)
    ref = R.grouped(q, kc, vc, gp, pre)
    for chunk in (64, None):
        got = run(cascade_prefix_attention, q, kc, vc, gp, pre, block_m=128, block_n=32, num_warps=8, kv_chunk=chunk)
        close(*got, *ref, dtype, f"{kind} chunk {chunk}")
