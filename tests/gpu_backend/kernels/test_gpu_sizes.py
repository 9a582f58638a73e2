"""The same checks at real sizes in bf16 on the GPU (Llama-3.1-8B: 32 q / 8 kv heads, d 128;
Qwen-2.5: 40 q / 8 kv). Skipped without CUDA."""
import numpy as np
import pytest
import torch

from gb_util import close, i32, poisoned, queries, stored, tokens
from gpu_backend.kernels import layout as L
from gpu_backend.kernels import reference as R
from gpu_backend.kernels.cascade import cascade_prefix_attention
from gpu_backend.kernels.decode import decode_attention
from gpu_backend.kernels.dense import dense_prefix_attention
from gpu_backend.kernels.extend import extend_attention
from gpu_backend.kernels.kv_write import write_kv
from gpu_backend.kernels.merge import merge_states

pytestmark = pytest.mark.gpu
BF = torch.bfloat16
N_KV, D = 8, 128


@pytest.mark.parametrize("G", [4, 5])
@pytest.mark.parametrize("kind", ["slots", "pages16", "slab"])
def test_decode_real(kind, G):
    lens = [4096 + 17, 0, 1, 1000, 16384, 333, 64, 2049]
    kc, vc, kv = stored(kind, lens, N_KV, D, BF, seed=G)
    q = queries(len(lens), N_KV * G, D, BF, seed=G)
    o, lse = decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, out=poisoned(q.shape, BF),
                              lse=poisoned(q.shape[:2], torch.float32))
    close(o, lse, *R.decode(q, kc, vc, kv), BF, kind)


@pytest.mark.parametrize("G", [4, 5])
@pytest.mark.parametrize("kind", ["slots", "pages16", "slab"])
def test_cascade_and_dense_real(kind, G):
    rows, lens = [1, 16, 0, 300], [4096 + 17, 1, 50, 2000]
    kc, vc, pre = stored(kind, lens, N_KV, D, BF, seed=G)
    q = queries(sum(rows), N_KV * G, D, BF, seed=G)
    gp = i32(np.concatenate([[0], np.cumsum(rows)]))
    ref = R.grouped(q, kc, vc, gp, pre)
    o, lse = cascade_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=pre,
                                      out=poisoned(q.shape, BF), lse=poisoned(q.shape[:2], torch.float32))
    close(o, lse, *ref, BF, "cascade " + kind)
    if kind == "slab":
        for tma in (False, True):
            o, lse = dense_prefix_attention(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=pre,
                                            use_tma=tma, out=poisoned(q.shape, BF),
                                            lse=poisoned(q.shape[:2], torch.float32))
            close(o, lse, *ref, BF, f"dense tma={tma}")


@pytest.mark.parametrize("kind", ["slots", "pages16", "slab"])
def test_extend_real(kind):
    qo, lens = [300, 1, 17, 0], [1000, 0, 4000, 7]
    kc, vc, pre = stored(kind, lens, N_KV, D, BF, seed=1)
    T = sum(qo)
    q = queries(T, 32, D, BF, seed=1)
    kn, vn = (t[0].cuda() for t in tokens([T], N_KV, D, BF, seed=3))
    qo_ptr = i32(np.concatenate([[0], np.cumsum(qo)]))
    o, lse = extend_attention(q=q, k_new=kn, v_new=vn, qo_indptr=qo_ptr, k_cache=kc, v_cache=vc, prefix=pre,
                              out=poisoned(q.shape, BF), lse=poisoned(q.shape[:2], torch.float32))
    close(o, lse, *R.extend(q, kn, vn, qo_ptr, kc, vc, pre), BF, "extend " + kind)


def test_merge_and_write_real():
    g = torch.Generator().manual_seed(0)
    o1 = torch.randn(512, 32, D, generator=g).to(BF).cuda()
    o2 = torch.randn(512, 32, D, generator=g).to(BF).cuda()
    l1 = (torch.randn(512, 32, generator=g) * 3).cuda()
    l2 = (torch.randn(512, 32, generator=g) * 3).cuda()
    l2[::7] = float("-inf")
    o, lse = merge_states(o1=o1, lse1=l1, o2=o2, lse2=l2, out=poisoned(o1.shape, BF))
    close(o, lse, *R.merge(o1, l1, o2, l2), BF, "merge")
    kc, vc = torch.randn(50_000, N_KV, D, generator=g).to(BF).cuda(), torch.randn(50_000, N_KV, D).to(BF).cuda()
    k, v = torch.randn(4000, N_KV, D).to(BF).cuda(), torch.randn(4000, N_KV, D).to(BF).cuda()
    slots = i32(torch.randperm(50_000, generator=g)[:4000])
    rk, rv = R.kv_write(kc, vc, k, v, slots)
    write_kv(k_cache=kc, v_cache=vc, k=k, v=v, slots=slots)
    assert torch.equal(kc.cpu(), rk) and torch.equal(vc.cpu(), rv)


def test_cascade_graph_replay_matches_launch():
    """check=False + host max sizes: capturable; replays give the launch's result."""
    lens = [16384, 999]  # groups of 16 and 4 rows
    kc, vc, pre = stored("slab", lens, N_KV, D, BF, seed=4)
    q = queries(20, 32, D, BF, seed=4)
    gp = i32([0, 16, 20])
    out, lse = torch.empty_like(q), torch.empty(20, 32, device="cuda")
    kw = dict(q=q, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=pre, out=out, lse=lse,
              check=False, max_group_size=16, max_kv_len=16384)
    cascade_prefix_attention(**kw)
    torch.cuda.synchronize()
    want = out.clone(), lse.clone()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cascade_prefix_attention(**kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    L.validate(pre, n=2, num_slots=kc.shape[0], device=kc.device, name="prefix")
