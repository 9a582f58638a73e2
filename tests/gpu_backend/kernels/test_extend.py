"""Prefill / extend: new tokens see their cached prefix (any storage) and causally themselves."""
import pytest
import torch

from gb_util import DEV, STORAGES, close, i32, poisoned, queries, stored
from gpu_backend.kernels import layout as L
from gpu_backend.kernels import reference as R
from gpu_backend.kernels.decode import decode_attention
from gpu_backend.kernels.extend import extend_attention
from gpu_backend.kernels.kv_write import write_kv

QO = [3, 0, 20, 1]       # new tokens per request (an empty chunk, a one-token chunk)
PREFIX = [20, 5, 33, 0]  # cached prefix per request (an empty one)


def chunk(T, n_kv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, n_kv, d, generator=g).to(dtype).to(DEV),
            torch.randn(T, n_kv, d, generator=g).to(dtype).to(DEV))


def run(q, kn, vn, qo, kc, vc, pre, **kw):
    T, n_q, d = q.shape
    return extend_attention(q=q, k_new=kn, v_new=vn, qo_indptr=qo, k_cache=kc, v_cache=vc, prefix=pre,
                            out=poisoned((T, n_q, d), q.dtype), lse=poisoned((T, n_q), torch.float32), **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("G,d,n_kv", [(1, 64, 2), (4, 128, 1), (5, 64, 1), (8, 64, 1)])
@pytest.mark.parametrize("kind", STORAGES)
def test_extend_matches_reference(kind, G, d, n_kv, dtype):
    kc, vc, pre = stored(kind, PREFIX, n_kv, d, dtype, seed=G)
    T = sum(QO)
    q = queries(T, n_kv * G, d, dtype, seed=d)
    kn, vn = chunk(T, n_kv, d, dtype, seed=G)
    qo = i32([0, 3, 3, 23, 24])
    ref = R.extend(q, kn, vn, qo, kc, vc, pre)
    close(*run(q, kn, vn, qo, kc, vc, pre, block_m=16, block_n=16), *ref, dtype, kind)
    if kind == "slots":
        close(*run(q, kn, vn, qo, kc, vc, pre), *ref, dtype, kind + " default tiles")


def test_last_token_of_chunk_equals_decode():
    """After write_kv, decoding the chunk's last token over prefix + chunk (slot lists) gives the
    same as extend's last row: the prefill and decode paths agree."""
    dtype, n_kv, G, d = torch.float16, 2, 4, 64
    kc, vc, pre = stored("slots", [30], n_kv, d, dtype, seed=9)
    T = 13
    q = queries(T, n_kv * G, d, dtype, seed=9)
    kn, vn = chunk(T, n_kv, d, dtype, seed=9)
    used = set(pre.indices.tolist())
    free = [s for s in range(kc.shape[0]) if s not in used][:T]
    write_kv(k_cache=kc, v_cache=vc, k=kn, v=vn, slots=i32(free))
    o, lse = run(q, kn, vn, i32([0, T]), kc, vc, pre)
    full = L.SlotLists(i32([0, 30 + T]), i32(pre.indices.tolist() + free))
    od, ld = decode_attention(q=q[T - 1:], k_cache=kc, v_cache=vc, kv=full)
    assert (od[0].float() - o[T - 1].float()).abs().max() < 2e-3
    assert (ld[0] - lse[T - 1]).abs().max() < 1e-3


def test_extend_rejects():
    kc, vc, pre = stored("slots", [4], 1, 64, torch.float16, seed=0)
    q = queries(2, 4, 64, torch.float16, seed=0)
    kn, vn = chunk(2, 1, 64, torch.float16, 0)
    with pytest.raises(ValueError, match=r"k_new must be \[2, 1, 64\]"):
        extend_attention(q=q, k_new=kn[:1], v_new=vn, qo_indptr=i32([0, 2]), k_cache=kc, v_cache=vc, prefix=pre)
    bad = L.SlotLists(pre.indptr, i32([0, 1, 2, 10 ** 6]))
    with pytest.raises(ValueError, match=r"prefix.indices\[3\] = 1000000"):
        extend_attention(q=q, k_new=kn, v_new=vn, qo_indptr=i32([0, 2]), k_cache=kc, v_cache=vc, prefix=bad)


@pytest.mark.parametrize("order", ["heavy_first", "blocks_major"])
@pytest.mark.parametrize("G,d,n_kv", [(1, 64, 2), (5, 64, 1)])
def test_every_start_order_gives_the_same_result(order, G, d, n_kv):
    """The programs' start order (extend.ORDERS) changes when each row block runs, never what it computes:
    ragged chunks of several row blocks each (16-row tiles), an empty chunk, requests longest last."""
    dtype, qo_lens, prefix = torch.float32, [5, 0, 17, 40], [9, 3, 0, 21]
    kc, vc, pre = stored("slots", prefix, n_kv, d, dtype, seed=3)
    T = sum(qo_lens)
    q = queries(T, n_kv * G, d, dtype, seed=4)
    kn, vn = chunk(T, n_kv, d, dtype, seed=5)
    qo = i32([sum(qo_lens[:i]) for i in range(len(qo_lens) + 1)])
    ref = R.extend(q, kn, vn, qo, kc, vc, pre)
    close(*run(q, kn, vn, qo, kc, vc, pre, block_m=16, block_n=16, order=order), *ref, dtype, order)


def test_extend_rejects_an_unknown_order():
    kc, vc, pre = stored("slots", [4], 1, 64, torch.float16, seed=0)
    q = queries(2, 4, 64, torch.float16, seed=0)
    kn, vn = chunk(2, 1, 64, torch.float16, 0)
    with pytest.raises(ValueError, match="order must be one of in_order, heavy_first, blocks_major"):
        extend_attention(q=q, k_new=kn, v_new=vn, qo_indptr=i32([0, 2]), k_cache=kc, v_cache=vc, prefix=pre,
                         order="reverse")
