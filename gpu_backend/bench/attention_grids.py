"""Attention-kernel grids of the H200 benchmark (kernels_h200): decode, cascade and dense prefix passes,
extend, each row with its bytes, FLOPs and fraction of the ceilings."""
from __future__ import annotations

import torch

from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from ..kernels.dense import dense_prefix_attention
from ..kernels.extend import extend_attention
from . import peers
from .problems import KV_BYTES_PER_TOKEN, N_KV, D, i32, queries, seqs
from .timing import bench, graph_of

GS = {4: 32, 5: 40}  # G -> n_q heads (Llama-3.1-8B, Qwen-2.5 style), 8 KV heads, d 128


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
                fn = lambda: dense_prefix_attention(**kw)  # noqa
                r = metrics({"G": G, "L": Lp, "B": B, "M_eff": B * G}, bench(fn), by, fl, ceil)
                if torch.cuda.is_available():  # as the engine runs it: replays, no launch gap
                    r["graph"] = metrics({}, bench(graph_of(fn)[0]), by, fl, ceil)
                s0 = int(kv.start[0])
                ks, vs = pool.k[s0:s0 + Lp], pool.v[s0:s0 + Lp]
                try:
                    sd = peers.sdpa_stacked(q, ks, vs)
                    r["sdpa"] = metrics({}, bench(sd), by, fl, ceil)
                    r["vs_sdpa"] = r["sdpa"]["us"] / r["us"]
                    if "graph" in r:
                        r["sdpa"]["graph"] = metrics({}, bench(graph_of(sd)[0]), by, fl, ceil)
                        r["graph_vs_sdpa"] = r["sdpa"]["graph"]["us"] / r["graph"]["us"]
                    err = (peers.sdpa_stacked_out(q, ks, vs).float() - out.float()).abs().max().item()
                    r["max_abs_diff_vs_sdpa"] = err
                except Exception as e:
                    r["sdpa_error"] = repr(e)
                rows.append(r)
                print(f"dense G{G} L{Lp:6d} B{B:4d} {r['us']:8.1f} us {r['TFLOPs']:6.0f} TF/s "
                      f"{r['GBps']:6.0f} GB/s vs SDPA x{r.get('vs_sdpa', float('nan')):.2f}, "
                      f"graphs x{r.get('graph_vs_sdpa', float('nan')):.2f}")
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
