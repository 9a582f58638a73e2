"""Section `small`: the LSE merge, KV write and KV copy over row / token counts."""
from __future__ import annotations

import torch

from gpu_backend.kernels.kv_write import write_kv
from gpu_backend.kernels.merge import merge_states

from .attention import _print_attn
from .common import ATTN_FIELDS, CUDA, DEV, copies_for, rnd, time_calls

def s_small(run):
    """LSE merge, KV write, KV copy over row / token counts."""
    pool, m = run.pool, run.model
    n_kv, d, G = m.n_kv_heads, m.head_dim, m.group_size
    dt = run.dtype
    # 2x-spaced token counts (the first H200 run's 4x grid left merge / KV write held-out points as
    # extrapolations over a 4x gap)
    Ts = [2**i for i in range(15)] if not run.args.smoke else [1, 5, 33]
    for n_q in sorted({n_kv * G, n_kv * 5}):
        for T in Ts:
            if run.out_of_time("small"):
                return
            by = 3 * T * n_q * d * 2 + 3 * T * n_q * 4
            k = copies_for(by)
            fns = []
            for _ in range(k):
                o1, o2 = rnd(T, n_q, d, dtype=dt), rnd(T, n_q, d, dtype=dt)
                l1, l2 = rnd(T, n_q, dtype=torch.float32), rnd(T, n_q, dtype=torch.float32)
                out, ol = torch.empty_like(o1), torch.empty_like(l1)
                fns.append(lambda a=(o1, l1, o2, l2, out, ol): merge_states(o1=a[0], lse1=a[1], o2=a[2], lse2=a[3],
                                                                            out=a[4], out_lse=a[5]))
            t = time_calls(fns)
            r = dict(family="merge", kernel="merge", storage="", page_size="", G=n_q // n_kv, n_q=n_q, n_kv=n_kv, d=d,
                     B=T, L=0, M_eff="", n_req=T, q_len=1, T=T, launches=1, bytes=by, flops=0, **t)
            run.row("attention.csv", ATTN_FIELDS, r)
            _print_attn(r)
    for T in Ts:
        if run.out_of_time("small"):
            return
        by = 2 * 2 * T * n_kv * d * 2 + 4 * T
        k = copies_for(by)
        fns = []
        for _ in range(k):
            kk, vv = rnd(T, n_kv, d, dtype=dt), rnd(T, n_kv, d, dtype=dt)
            slots = torch.randperm(pool.S, device=DEV)[:T].to(torch.int32) if not CUDA else \
                torch.unique(pool.randint(pool.S, 2 * T))[:T].to(torch.int32)
            slots = slots[torch.randperm(slots.numel(), device=DEV)]
            fns.append(lambda a=(kk, vv, slots): write_kv(k_cache=pool.k, v_cache=pool.v, k=a[0], v=a[1], slots=a[2],
                                                          check=False))
        t = time_calls(fns)
        r = dict(family="kv_write", kernel="kv_write", storage="slots", page_size=1, G=G, n_q=n_kv * G, n_kv=n_kv,
                 d=d, B=T, L=0, n_req=T, q_len=1, T=T, launches=1, bytes=by, flops=0, **t)
        run.row("attention.csv", ATTN_FIELDS, r)
        _print_attn(r)
    # KV copy (compaction): T tokens from random slots to a contiguous run, K and V (torch index ops)
    for T in (Ts if run.args.smoke else [16 * 2**i for i in range(13)]):  # 16 .. 64K, 2x apart
        if run.out_of_time("small"):
            return
        by = 2 * 2 * T * n_kv * d * 2
        k = copies_for(by)
        fns = []
        for _ in range(k):
            src = pool.randint(pool.S, T).long()
            d0 = int(torch.randint(0, pool.S - T, (1,)).item())

            def cp(src=src, d0=d0):
                pool.k[d0:d0 + T] = pool.k.index_select(0, src)
                pool.v[d0:d0 + T] = pool.v.index_select(0, src)
            fns.append(cp)
        t = time_calls(fns)
        r = dict(family="kv_copy", kernel="torch.index_select+copy", storage="slots", page_size=1, G=G,
                 n_q=n_kv * G, n_kv=n_kv, d=d, B=T, L=0, n_req=1, q_len=1, T=T, launches=4, bytes=by, flops=0, **t)
        run.row("attention.csv", ATTN_FIELDS, r)
        _print_attn(r)
