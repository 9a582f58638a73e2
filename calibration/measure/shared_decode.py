"""Section `shared_decode`: the baselines' decode over shared prefixes, as the engine launches it.

Under `token` and `paged16` every decoding request reads its whole context: the shared prefix of its
role and its own suffix, through one slot list or page table per request. B requests over k roles
(request b is of role b mod k: the engine's rows interleave roles as they arrive) each read their role's
L_p prefix tokens and S_SUF tokens of their own. What a re-read of a prefix costs once another request
of the role has read it (the L2 share the cost model calls ``attn.decode.shared_reread``) is the gap
between this launch and the same launch over distinct contexts of the same lengths, timed beside it
(family `decode_distinct`).

Storages: 'slots' (page size 1; each prefix one contiguous run of slots, as a fresh pool hands a
prefill its slots, each suffix random slots), 'slots_random' (the prefix's slots random too) and
'pages16' (random pages of 16; the prefix's pages shared by its role).
"""
from __future__ import annotations

import torch

from gpu_backend.kernels import layout as L
from gpu_backend.kernels.decode import decode_attention

from .common import DEV, copies_for, i32, rnd, time_calls

FIELDS = ["family", "storage", "G", "n_q", "n_kv", "d", "B", "roles", "L", "suffix", "distinct_tokens", "k",
          "copies", "reps", "median_us", "p10_us", "p90_us"]
S_SUF = 512  # each request's own tokens (the validation traffic's decode suffixes: a few hundred to ~1K)


def _grid(run):
    if run.args.smoke:
        return dict(L=[64], k=[1, 2], B=[1, 3], G=[4], storages=["slots", "pages16"], suffix=16)
    # the validation workloads' cases first (a truncated run keeps them): Qwen-2.5-14B's group, 16K, 4 roles
    return dict(L=[16384, 4096], k=[4, 1], B=[1, 2, 4, 8, 16, 32, 64, 96, 128, 192], G=[5, 4],
                storages=["slots", "pages16", "slots_random"], suffix=S_SUF)


def _ids(pool, n: int, contiguous: bool) -> torch.Tensor:
    if not contiguous:
        return pool.randint(pool.S, n)
    base = int(torch.randint(0, pool.S - n + 1, (1,), generator=pool.gen, device=DEV).item())
    return torch.arange(base, base + n, device=DEV, dtype=torch.int32)


def shared_layout(pool, storage: str, B: int, k: int, Lp: int, suffix: int, shared: bool) -> L.KVLayout:
    """B sequences of Lp + suffix tokens; with ``shared``, sequence b's first Lp tokens are role (b mod k)'s."""
    n = Lp + suffix
    if storage == "pages16":
        ps = 16
        pp, sp = Lp // ps, -(-suffix // ps)
        pre = [pool.randint(pool.S // ps, pp) for _ in range(k if shared else B)]
        rows = [torch.cat([pre[b % k] if shared else pre[b], pool.randint(pool.S // ps, sp)]) for b in range(B)]
        return L.PageTable(i32([b * (pp + sp) for b in range(B + 1)]), torch.cat(rows), i32([n] * B), ps)
    contiguous = storage == "slots"
    pre = [_ids(pool, Lp, contiguous) for _ in range(k if shared else B)]
    rows = [torch.cat([pre[b % k] if shared else pre[b], pool.randint(pool.S, suffix)]) for b in range(B)]
    return L.SlotLists(i32([b * n for b in range(B + 1)]), torch.cat(rows))


def s_shared_decode(run):
    pool, m = run.pool, run.model
    n_kv, d = m.n_kv_heads, m.head_dim
    gr = _grid(run)
    suffix = gr["suffix"]
    pts = [(st, G, Lp, k, B) for st in gr["storages"] for G in gr["G"] for Lp in gr["L"] for k in gr["k"]
           for B in gr["B"] if B >= k]
    for st, G, Lp, k, B in pts:
        for fam in ("decode_shared", "decode_distinct"):
            if run.out_of_time("shared_decode"):
                return
            shared = fam == "decode_shared"
            distinct = (k * Lp if shared else B * Lp) + B * suffix
            if distinct > pool.S:
                continue
            n_q = n_kv * G
            kvbytes = distinct * n_kv * d * 2 * pool.k.element_size()
            q = rnd(B, n_q, d, dtype=run.dtype)
            out, lse = torch.empty_like(q), torch.empty(B, n_q, device=DEV)
            copies = copies_for(kvbytes)
            fns = []
            for _ in range(copies):
                kv = shared_layout(pool, st, B, k, Lp, suffix, shared)
                fns.append(lambda kv=kv: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, out=out,
                                                          lse=lse, check=False, max_kv_len=Lp + suffix,
                                                          mean_kv_len=Lp + suffix))
            t = time_calls(fns)
            r = dict(family=fam, storage=st, G=G, n_q=n_q, n_kv=n_kv, d=d, B=B, roles=k, L=Lp, suffix=suffix,
                     distinct_tokens=distinct, copies=copies, **t)
            run.row("shared_decode.csv", FIELDS, r)
            print(f"   {fam:15s} {st:12s} G{G} L{Lp:6d} k{k} B{B:4d} {r['median_us']:9.1f} us", flush=True)
