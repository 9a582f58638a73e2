"""H200 benchmark of the attention kernels: ceilings, grids, peers, the contiguity question and
one Llama-3.1-8B layer's decode step. One process, one device call; writes h200.json / h200.md.

    PYTHONUNBUFFERED=1 python3 -m gpu_backend.bench.kernels_h200 --out $OUT [--commit HASH]
    python -m gpu_backend.bench.kernels_h200 --smoke --out /tmp/x     # tiny, CPU interpreter
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback

import torch

from .. import layout as L
from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from ..kernels.dense import dense_prefix_attention
from ..kernels.extend import extend_attention
from ..kernels.kv_write import write_kv
from ..kernels.merge import merge_states
from . import peers
from .problems import KV_BYTES_PER_TOKEN, N_KV, D, Pool, i32, queries, seqs
from .report import write_markdown
from .timing import bench, ceilings, graph_of

GS = {4: 32, 5: 40}  # G -> n_q heads (Llama-3.1-8B, Qwen-2.5 style), 8 KV heads, d 128


class Run:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.res = {"meta": meta(args), "sections": {}, "errors": []}

    def left(self) -> float:
        """Seconds left of the running section's share of the budget."""
        return self.deadline - time.time()

    def save(self):
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, "h200.json"), "w") as f:
            json.dump(self.res, f, indent=1)
        write_markdown(self.res, os.path.join(self.args.out, "h200.md"))

    def section(self, name, fn):
        print(f"== {name} (t = {time.time() - self.t0:.0f} s)", flush=True)
        self.deadline = time.time() + SHARE[name] * self.args.budget_s
        t = time.time()
        try:
            self.res["sections"][name] = fn(self)
        except Exception as e:  # keep the other sections' figures
            traceback.print_exc()
            self.res["errors"].append(f"{name}: {type(e).__name__}: {e}")
        if isinstance(self.res["sections"].get(name), dict):
            self.res["sections"][name]["seconds"] = round(time.time() - t, 1)
        self.save()


def meta(args):
    m = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "commit": args.commit, "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
         "torch": torch.__version__, "python": platform.python_version(), "smoke": args.smoke}
    try:
        import triton
        m["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        m.update(gpu=p.name, sms=p.multi_processor_count, gpu_mem_GiB=round(p.total_memory / 2**30, 1),
                 cuda=torch.version.cuda)
    return m


def metrics(r, t_us, bytes_, flops, ceil):
    r.update(bytes=bytes_, flops=flops, us=t_us["median_us"], p10_us=t_us["p10_us"], p90_us=t_us["p90_us"],
             reps=t_us["reps"])
    s = t_us["median_us"] * 1e-6
    r["GBps"] = bytes_ / s / 1e9
    r["TFLOPs"] = flops / s / 1e12
    if ceil:
        r["frac_copy"] = r["GBps"] / ceil["copy_GBps"]
        r["frac_gemm"] = r["TFLOPs"] / ceil["gemm_TFLOPs"]
        r["floor_us"] = max(bytes_ / (ceil["copy_GBps"] * 1e9), flops / (ceil["gemm_TFLOPs"] * 1e12)) * 1e6
        r["x_floor"] = r["us"] / r["floor_us"]
    return r


def grid(args):
    if args.smoke:
        return [256, 600], [1, 4], [4]
    return [1024, 4096, 16384, 32768], [1, 4, 16, 64, 256, 512], [4, 5]


# ---------------------------------------------------------------------------------------------
def s_ceilings(run):
    if not torch.cuda.is_available():
        return {"copy_GBps": 100.0, "gemm_TFLOPs": 1.0, "note": "smoke: not measured"}
    c = ceilings()
    print(f"copy {c['copy_GBps']:.0f} GB/s, bf16 GEMM {c['gemm_TFLOPs']:.0f} TFLOP/s")
    return c


def s_decode(run):
    """Paged decode: each request reads its own KV (page size 1 random slots, or pages of 16)."""
    Ls, Bs, Gs = grid(run.args)
    pool = run.pool
    ceil = run.res["sections"].get("ceilings")
    rows = []
    for kind in ("slots", "pages16"):
        for G in Gs:
            for Lp in Ls:
                for B in Bs:
                    if run.left() < 0:
                        return {"rows": rows, "truncated": True}
                    kv = seqs(pool, kind, B, Lp)
                    q = queries(B, GS[G], pool.dtype)
                    out, lse = torch.empty_like(q), torch.empty(B, GS[G], device=q.device)
                    fn = lambda: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, out=out, lse=lse,  # noqa
                                                  check=False, max_kv_len=Lp)
                    t = bench(fn)
                    by = B * Lp * KV_BYTES_PER_TOKEN + 2 * q.numel() * 2
                    r = metrics({"storage": kind, "G": G, "L": Lp, "B": B}, t, by, 4 * B * GS[G] * Lp * D, ceil)
                    rows.append(r)
                    print(f"decode {kind:7s} G{G} L{Lp:6d} B{B:4d} {r['us']:9.1f} us {r['GBps']:7.0f} GB/s")
    return {"rows": rows}


def _prefix_problem(run, kind, G, Lp, B):
    pool = run.pool
    kv = seqs(pool, kind, 1, Lp)
    q = queries(B, GS[G], pool.dtype)
    return kv, q, i32([0, B])


def s_cascade(run):
    """Cascade prefix pass: B queries of one group stacked, prefix read once, split along KV."""
    Ls, Bs, Gs = grid(run.args)
    pool = run.pool
    ceil = run.res["sections"].get("ceilings")
    rows = []
    for kind in ("slab", "slots", "pages16"):
        for G in Gs:
            for Lp in Ls:
                for B in Bs:
                    if run.left() < 0:
                        return {"rows": rows, "truncated": True}
                    kv, q, gp = _prefix_problem(run, kind, G, Lp, B)
                    out, lse = torch.empty_like(q), torch.empty(B, GS[G], device=q.device)
                    fn = lambda: cascade_prefix_attention(  # noqa
                        q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=kv, out=out, lse=lse,
                        check=False, max_group_size=B, max_kv_len=Lp)
                    by = Lp * KV_BYTES_PER_TOKEN + 2 * q.numel() * 2
                    fl = 4 * B * GS[G] * Lp * D
                    r = metrics({"storage": kind, "G": G, "L": Lp, "B": B, "M_eff": B * G},
                                bench(fn), by, fl, ceil)
                    if torch.cuda.is_available():
                        replay, _g = graph_of(fn)
                        tg = bench(replay)
                        r["graph"] = metrics({}, tg, by, fl, ceil)
                        # the launcher's split choice vs fixed split sizes (graph replays)
                        sweep = {}
                        for ch in (512, 1024, 2048):
                            if Lp // ch < 2 or Lp // ch > 64:
                                continue
                            f2 = lambda: cascade_prefix_attention(  # noqa
                                q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=kv, out=out,
                                lse=lse, check=False, max_group_size=B, max_kv_len=Lp, kv_chunk=ch)
                            sweep[ch] = bench(graph_of(f2)[0])["median_us"]
                        r["graph_chunk_sweep_us"] = sweep
                        if sweep:
                            r["graph_best_fixed_chunk_us"] = min(sweep.values())
                    rows.append(r)
                    gx = r.get("graph", {}).get("x_floor", float("nan"))
                    print(f"cascade {kind:7s} G{G} L{Lp:6d} B{B:4d} {r['us']:8.1f} us plain, "
                          f"{r.get('graph', r)['us']:8.1f} us graph, x floor {gx:.2f}")
    return {"rows": rows}


def s_dense(run):
    """Dense prefix pass over a slab, against torch SDPA on the same contiguous problem."""
    Ls, Bs, Gs = grid(run.args)
    pool = run.pool
    ceil = run.res["sections"].get("ceilings")
    rows = []
    for G in Gs:
        for Lp in Ls:
            for B in Bs:
                if run.left() < 0:
                    return {"rows": rows, "truncated": True}
                kv, q, gp = _prefix_problem(run, "slab", G, Lp, B)
                out, lse = torch.empty_like(q), torch.empty(B, GS[G], device=q.device)
                kw = dict(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=kv, out=out, lse=lse,
                          check=False, max_group_size=B, max_kv_len=Lp)
                by = Lp * KV_BYTES_PER_TOKEN + 2 * q.numel() * 2
                fl = 4 * B * GS[G] * Lp * D
                r = metrics({"G": G, "L": Lp, "B": B, "M_eff": B * G},
                            bench(lambda: dense_prefix_attention(**kw)), by, fl, ceil)
                s0 = int(kv.start[0])
                ks, vs = pool.k[s0:s0 + Lp], pool.v[s0:s0 + Lp]
                try:
                    sd = peers.sdpa_stacked(q, ks, vs)
                    r["sdpa"] = metrics({}, bench(sd), by, fl, ceil)
                    r["vs_sdpa"] = r["sdpa"]["us"] / r["us"]
                    err = (peers.sdpa_stacked_out(q, ks, vs).float() - out.float()).abs().max().item()
                    r["max_abs_diff_vs_sdpa"] = err
                except Exception as e:
                    r["sdpa_error"] = repr(e)
                rows.append(r)
                print(f"dense G{G} L{Lp:6d} B{B:4d} {r['us']:8.1f} us {r['TFLOPs']:6.0f} TF/s "
                      f"{r['GBps']:6.0f} GB/s vs SDPA x{r.get('vs_sdpa', float('nan')):.2f}")
    return {"rows": rows}


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


def s_extend(run):
    ceil = run.res["sections"].get("ceilings")
    pool = run.pool
    rows = []
    pts = [(4, 512, 4096), (4, 512, 16384), (1, 2048, 16384)] if not run.args.smoke else [(2, 20, 100)]
    for n_req, chunk, Lp in pts:
        kv = seqs(pool, "pages16", n_req, Lp)
        T = n_req * chunk
        q = queries(T, 32, pool.dtype)
        kn, vn = queries(T, N_KV, pool.dtype, 7), queries(T, N_KV, pool.dtype, 8)
        qo = i32(torch.arange(n_req + 1) * chunk)
        t = bench(lambda: extend_attention(q=q, k_new=kn, v_new=vn, qo_indptr=qo, k_cache=pool.k, v_cache=pool.v,
                                           prefix=kv, check=False, max_qo_len=chunk))
        fl = 4 * T * 32 * D * Lp + 2 * n_req * 32 * D * chunk * chunk
        by = n_req * (Lp + chunk) * KV_BYTES_PER_TOKEN + 2 * q.numel() * 2
        r = metrics({"requests": n_req, "chunk": chunk, "L": Lp, "storage": "pages16"}, t, by, fl, ceil)
        rows.append(r)
        print(f"extend {n_req}x{chunk} over {Lp}: {r['us']:.1f} us, {r['TFLOPs']:.0f} TF/s")
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


# share of --budget-s each section may take before its grid stops (recorded as truncated)
SHARE = {"ceilings": 0.03, "decode": 0.12, "cascade": 0.25, "dense": 0.1, "merge_write": 0.03,
         "contiguity": 0.07, "e2e": 0.1, "extend": 0.03, "flex": 0.17}
SECTIONS = [("ceilings", s_ceilings), ("decode", s_decode), ("cascade", s_cascade), ("dense", s_dense),
            ("merge_write", s_merge_write), ("contiguity", s_contiguity), ("e2e", s_e2e),
            ("extend", s_extend), ("flex", s_flex)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU interpreter)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="whole run's time budget (s), shared per SHARE")
    ap.add_argument("--only", default="", help="comma-separated section names")
    ap.add_argument("--pool-slots", type=int, default=12 * 2**20)
    args = ap.parse_args(argv)
    run = Run(args)
    run.pool = Pool(args.pool_slots if not args.smoke else 4096)
    only = set(filter(None, args.only.split(",")))
    for name, fn in SECTIONS:
        if not only or name in only or name == "ceilings":
            run.section(name, fn)
    print(f"done in {time.time() - run.t0:.0f} s; errors: {run.res['errors']}")


if __name__ == "__main__":
    main()
