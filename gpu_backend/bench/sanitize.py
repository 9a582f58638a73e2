"""A small run of every kernel (each storage, split and unsplit, TMA and block pointers), checked
against the reference: the program compute-sanitizer's memcheck runs (reports/kernels/sanitizer.txt).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 -m gpu_backend.bench.sanitize
"""
import torch

from ..kernels import layout as L
from ..kernels import reference as R
from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from ..kernels.dense import dense_prefix_attention
from ..kernels.extend import extend_attention
from ..kernels.kv_write import write_kv
from ..kernels.merge import merge_states


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    g = torch.Generator().manual_seed(0)
    S, n_kv, d, G = 3000, 2, 128, 5
    kc = torch.randn(S, n_kv, d, generator=g).to(dt).to(dev)
    vc = torch.randn(S, n_kv, d, generator=g).to(dt).to(dev)
    i32 = lambda x: torch.as_tensor(x, dtype=torch.int32).to(dev)  # noqa
    lens = [700, 0, 1, 333]
    perm = torch.randperm(S, generator=g)
    slots = L.SlotLists(i32([0, 700, 700, 701, 1034]), i32(perm[:1034]))
    pages = L.PageTable(i32([0, 44, 44, 45, 66]), i32(torch.randperm(S // 16, generator=g)[:66]), i32(lens), 16)
    slabs = L.Slabs(i32([S - 700, 5, 2000, 1200]), i32(lens))
    worst = 0.0

    def chk(name, res, ref):
        nonlocal worst
        e = (res[0].cpu().double() - ref[0]).abs().max().item()
        worst = max(worst, e)
        print(f"{name:40s} max |o - ref| = {e:.3g}")
        assert e < 5e-2, name

    q = torch.randn(4, n_kv * G, d, generator=g).to(dt).to(dev)
    for kv in (slots, pages, slabs):
        ref = R.decode(q, kc, vc, kv)
        for chunk in (64, None):
            chk(f"decode {type(kv).__name__} chunk={chunk}",
                decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, kv_chunk=chunk), ref)
    gp = i32([0, 3, 3, 4, 20])
    qg = torch.randn(20, n_kv * G, d, generator=g).to(dt).to(dev)
    for kv in (slots, pages, slabs):
        ref = R.grouped(qg, kc, vc, gp, kv)
        for chunk in (256, None):
            chk(f"cascade {type(kv).__name__} chunk={chunk}", cascade_prefix_attention(
                q=qg, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=kv, kv_chunk=chunk), ref)
    ref = R.grouped(qg, kc, vc, gp, slabs)
    for tma in (False, True):
        for chunk in (128, None):
            chk(f"dense tma={tma} chunk={chunk}", dense_prefix_attention(
                q=qg, k_cache=kc, v_cache=vc, group_indptr=gp, prefix=slabs, kv_chunk=chunk, use_tma=tma), ref)
    kn = torch.randn(20, n_kv, d, generator=g).to(dt).to(dev)
    vn = torch.randn(20, n_kv, d, generator=g).to(dt).to(dev)
    for kv in (slots, pages, slabs):
        chk(f"extend {type(kv).__name__}", extend_attention(
            q=qg, k_new=kn, v_new=vn, qo_indptr=gp, k_cache=kc, v_cache=vc, prefix=kv),
            R.extend(qg, kn, vn, gp, kc, vc, kv))
    o1, o2 = qg, torch.randn_like(qg)
    l1, l2 = torch.randn(20, n_kv * G, device=dev), torch.randn(20, n_kv * G, device=dev)
    l2[3] = float("-inf")
    chk("merge", merge_states(o1=o1, lse1=l1, o2=o2, lse2=l2), R.merge(o1, l1, o2, l2))
    new = i32(perm[1034:1054])
    rk, rv = R.kv_write(kc, vc, kn, vn, new)
    write_kv(k_cache=kc, v_cache=vc, k=kn, v=vn, slots=new)
    assert torch.equal(kc.cpu(), rk) and torch.equal(vc.cpu(), rv)
    print("kv_write exact")
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"all kernels ran; worst max |o - ref| = {worst:.3g}")


if __name__ == "__main__":
    main()
