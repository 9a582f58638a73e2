"""Step-level studies of the H200 benchmark (kernels_h200): LSE merge and KV write, the contiguity
question, one Llama-3.1-8B layer's decode step end to end, and FlexAttention as a peer."""
from __future__ import annotations

import torch

from ..kernels import layout as L
from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from ..kernels.dense import dense_prefix_attention
from ..kernels.kv_write import write_kv
from ..kernels.merge import merge_states
from . import peers
from .attention_grids import metrics
from .problems import KV_BYTES_PER_TOKEN, N_KV, D, i32, queries, seqs
from .timing import bench, graph_of


def s_merge_write(run):
    ceil = run.res["sections"].get("ceilings")
    dtype = run.pool.dtype
    rows = []
    sizes = [64, 512, 16384, 65536] if not run.args.smoke else [4, 64]
    for T in sizes:
        o1 = queries(T, 32, dtype, 1)
        o2 = queries(T, 32, dtype, 2)
        l1, l2 = torch.randn(T, 32, device=o1.device), torch.randn(T, 32, device=o1.device)
        out, ol = torch.empty_like(o1), torch.empty_like(l1)
        t = bench(lambda: merge_states(o1=o1, lse1=l1, o2=o2, lse2=l2, out=out, out_lse=ol))
        by = 3 * o1.numel() * 2 + 3 * l1.numel() * 4
        rows.append(metrics({"kernel": "merge", "T": T, "n_q": 32}, t, by, 0, ceil))
        del o1, o2, out
    S = run.pool.num_slots
    for T in ([512, 16384, 131072] if not run.args.smoke else [8, 64]):
        k = queries(T, N_KV, dtype, 3)
        v = queries(T, N_KV, dtype, 4)
        slots = run.pool.perm(S)[:T].to(torch.int32)
        t = bench(lambda: write_kv(k_cache=run.pool.k, v_cache=run.pool.v, k=k, v=v, slots=slots, check=False))
        rows.append(metrics({"kernel": "kv_write", "T": T}, t, 4 * k.numel() * 2 + T * 4, 0, ceil))
    for r in rows:
        print(f"{r['kernel']:8s} T{r['T']:7d} {r['us']:8.1f} us {r['GBps']:6.0f} GB/s")
    return {"rows": rows}


def s_contiguity(run):
    """The paper's '15.6x contiguous vs paged prefix read': same kernel, same tile, same batching.
    Prefix of L = 16K (32K) tokens read by B stacked queries through: a slab; page-size-1 slot
    lists that happen to be consecutive; page-size-1 slots at random; pages of 16 at random.
    Plus what changes when batching changes: the paged decode path (per-request re-read)."""
    pool = run.pool
    ceil = run.res["sections"].get("ceilings")
    rows = []
    Lps = [16384, 32768] if not run.args.smoke else [600]
    Bs = [1, 16, 64, 256] if not run.args.smoke else [4]
    for Lp in Lps:
        for B in Bs:
            if run.left() < 0:
                return {"rows": rows, "truncated": True}
            q = queries(B, 32, pool.dtype)
            gp = i32([0, B])
            out, lse = torch.empty_like(q), torch.empty(B, 32, device=q.device)
            r = {"L": Lp, "B": B, "G": 4}
            for kind in ("slab", "seq", "slots", "pages16"):
                kv = seqs(pool, kind, 1, Lp)
                fn = lambda: cascade_prefix_attention(  # noqa
                    q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=kv, out=out, lse=lse,
                    check=False, max_group_size=B, max_kv_len=Lp, block_n=64, kv_chunk=512)
                t = bench(graph_of(fn)[0] if torch.cuda.is_available() else fn)
                r[kind + "_us"] = t["median_us"]
            kv = seqs(pool, "slab", 1, Lp)
            dn = lambda: dense_prefix_attention(  # noqa
                q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=kv, out=out, lse=lse,
                check=False, max_group_size=B, max_kv_len=Lp)
            r["dense_slab_us"] = bench(graph_of(dn)[0] if torch.cuda.is_available() else dn)["median_us"]
            kvp = seqs(pool, "slots", B, Lp)  # each request its own copy: what paged decode reads
            pd = lambda: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kvp, out=out, lse=lse,  # noqa
                                          check=False, max_kv_len=Lp)
            r["paged_decode_private_us"] = bench(pd)["median_us"]
            shared = seqs(pool, "slots", 1, Lp)
            kv_sh = L.SlotLists(i32(torch.arange(B + 1) * Lp), shared.indices.repeat(B))
            ps = lambda: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kv_sh, out=out, lse=lse,  # noqa
                                          check=False, max_kv_len=Lp)
            r["paged_decode_shared_slots_us"] = bench(ps)["median_us"]
            for k in ("seq", "slots", "pages16"):
                r[f"ratio_{k}_over_slab"] = r[k + "_us"] / r["slab_us"]
            r["ratio_paged_decode_over_cascade_slab"] = r["paged_decode_private_us"] / r["slab_us"]
            r["ratio_paged_decode_over_dense"] = r["paged_decode_private_us"] / r["dense_slab_us"]
            r["prefix_bytes"] = Lp * KV_BYTES_PER_TOKEN
            rows.append(r)
            print("contig", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
    return {"rows": rows}


def s_e2e(run):
    """One Llama-3.1-8B layer's attention per decode step, L_p = 16K, 4 agent roles (B/4 requests each),
    suffix of `suffix` private tokens per request (page size 1, random slots). Each path includes the
    KV write of the B new tokens. paged: decode over prefix + suffix (page 1; the prefix slots are
    shared physically, re-read per request). cascade: one prefix pass for the 4 groups over their
    slabs + suffix decode + merge. dense: the same with the dense prefix pass."""
    pool = run.pool
    ceil = run.res["sections"].get("ceilings")
    Lp, roles, suffix = (16384, 4, 256) if not run.args.smoke else (300, 4, 7)
    Bs = [4, 16, 64, 256, 512] if not run.args.smoke else [4, 8]
    rows = []
    slabs = seqs(pool, "slab", roles, Lp)
    for B in Bs:
        if run.left() < 0:
            return {"rows": rows, "truncated": True}
        per = B // roles
        dtype = pool.dtype
        q = queries(B, 32, dtype)
        knew, vnew = queries(B, N_KV, dtype, 5), queries(B, N_KV, dtype, 6)
        suf = seqs(pool, "slots", B, suffix + 1, offset=roles * Lp)     # + the new token's slot
        new_slots = suf.indices.view(B, suffix + 1)[:, -1].contiguous()
        st = slabs.start.long()
        full_idx = []
        sidx = suf.indices.view(B, suffix + 1).long()
        for b in range(B):
            g = b // per
            full_idx.append(torch.cat([torch.arange(int(st[g]), int(st[g]) + Lp, device=q.device), sidx[b]]))
        full = L.SlotLists(i32(torch.arange(B + 1) * (Lp + suffix + 1)), torch.cat(full_idx).to(torch.int32))
        gp = i32(torch.arange(roles + 1) * per)
        o, lse = torch.empty_like(q), torch.empty(B, 32, device=q.device)
        po, pl = torch.empty_like(q), torch.empty_like(lse)
        so, sl = torch.empty_like(q), torch.empty_like(lse)

        def paged():
            write_kv(k_cache=pool.k, v_cache=pool.v, k=knew, v=vnew, slots=new_slots, check=False)
            decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=full, out=o, lse=lse, check=False,
                             max_kv_len=Lp + suffix + 1)

        def shared(prefix_pass):
            def step():
                write_kv(k_cache=pool.k, v_cache=pool.v, k=knew, v=vnew, slots=new_slots, check=False)
                prefix_pass(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=slabs, out=po, lse=pl,
                            check=False, max_group_size=per, max_kv_len=Lp)
                decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=suf, out=so, lse=sl, check=False,
                                 max_kv_len=suffix + 1)
                merge_states(o1=po, lse1=pl, o2=so, lse2=sl, out=o, out_lse=lse)
            return step

        r = {"L_p": Lp, "roles": roles, "B": B, "suffix": suffix + 1}
        outs = {}
        for name, fn in (("paged", paged), ("cascade", shared(cascade_prefix_attention)),
                         ("dense", shared(dense_prefix_attention))):
            r[name + "_plain_us"] = bench(fn)["median_us"]
            if torch.cuda.is_available():
                replay, _g = graph_of(fn)
                r[name + "_graph_us"] = bench(replay)["median_us"]
            fn()
            outs[name] = o.float().clone()
        r["max_abs_diff_cascade_vs_paged"] = (outs["cascade"] - outs["paged"]).abs().max().item()
        r["max_abs_diff_dense_vs_paged"] = (outs["dense"] - outs["paged"]).abs().max().item()
        key = "_graph_us" if torch.cuda.is_available() else "_plain_us"
        r["speedup_cascade_vs_paged"] = r["paged" + key] / r["cascade" + key]
        r["speedup_dense_vs_paged"] = r["paged" + key] / r["dense" + key]
        if ceil:
            by = roles * Lp * KV_BYTES_PER_TOKEN + B * (suffix + 1) * KV_BYTES_PER_TOKEN
            r["floor_shared_us"] = max(by / (ceil["copy_GBps"] * 1e9),
                                       4 * B * 32 * (Lp + suffix) * D / (ceil["gemm_TFLOPs"] * 1e12)) * 1e6
        rows.append(r)
        print("e2e", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    return {"rows": rows}


def s_flex(run):
    """FlexAttention (torch.compile) paged decode, page 128 (its block size), each request its own pages."""
    if run.args.smoke or not torch.cuda.is_available():
        return {"skipped": "needs CUDA"}
    ceil = run.res["sections"].get("ceilings")
    rows = []
    ps = 128
    n_pages = 16000  # 2M tokens: Flex's int64-index path failed to compile on torch 2.11 for larger caches
    kp = torch.randn(1, N_KV, n_pages * ps, D, device="cuda", dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    for Lp in (4096, 16384):
        for B in (1, 16, 64, 128):
            if run.left() < 0:
                return {"rows": rows, "truncated": True}
            P = Lp // ps
            if B * P > n_pages:
                continue
            pages = torch.randperm(n_pages, device="cuda")[:B * P].view(B, P).to(torch.int32)
            q = queries(B, 32, torch.bfloat16)
            fn = peers.flex_paged(q, kp, vp, pages, ps)
            t = bench(fn)
            by = B * Lp * KV_BYTES_PER_TOKEN
            r = metrics({"L": Lp, "B": B, "G": 4, "page": ps}, t, by, 4 * B * 32 * Lp * D, ceil)
            kc = kp[0].permute(1, 0, 2)    # the same physical slots seen slot-major for our kernel
            vc = vp[0].permute(1, 0, 2)
            kv = L.PageTable(i32(torch.arange(B + 1) * P), pages.flatten(), i32([Lp] * B), ps)
            ours = decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, check=False, max_kv_len=Lp)[0]
            r["max_abs_diff_vs_ours"] = (fn()[:, :, 0].float() - ours.float()).abs().max().item()
            r["ours_same_layout_us"] = bench(lambda: decode_attention(
                q=q, k_cache=kc, v_cache=vc, kv=kv, check=False, max_kv_len=Lp))["median_us"]
            rows.append(r)
            print(f"flex L{Lp} B{B}: {r['us']:.1f} us ({r['GBps']:.0f} GB/s); ours on its head-major layout "
                  f"{r['ours_same_layout_us']:.1f} us; diff {r['max_abs_diff_vs_ours']:.3g}")
    return {"rows": rows}
