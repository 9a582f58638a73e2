"""Sections `decode`, `dense`, `cascade`, `extend`: our Triton attention kernels over each storage,
with the split counts and tiles the launchers chose recorded per row."""
from __future__ import annotations

import torch
import triton

from gpu_backend.kernels import layout as L
from gpu_backend.kernels import split_kv
from gpu_backend.kernels.cascade import block_m_for, cascade_prefix_attention
from gpu_backend.kernels.decode import decode_attention
from gpu_backend.kernels import dense as _dense_mod
from gpu_backend.kernels.dense import dense_prefix_attention
from gpu_backend.kernels.extend import ORDERS, default_tiles, extend_attention

from gpu_backend.kernels import layout as L

from .common import ATTN_FIELDS, DEV, PAGE, copies_for, i32, rnd, time_calls

# The split planners the launchers call, wrapped to record their last answer (so the CSV holds the
# splits the kernels really ran with, whatever the launchers' policy is at this commit).
LAST_SPLIT: dict = {}
_plan, _dsplit = split_kv.plan_splits, _dense_mod._dense_splits


def _rec_plan(**kw):
    LAST_SPLIT["v"] = _plan(**kw)
    return LAST_SPLIT["v"]


def _rec_dense(*a, **kw):
    LAST_SPLIT["v"] = _dsplit(*a, **kw)
    return LAST_SPLIT["v"]


split_kv.plan_splits = _rec_plan
_dense_mod._dense_splits = _rec_dense


def _launch_params(kind, run, G, B, Lkv, n_q):
    """(block_m, block_n, num_warps, n_splits, chunk, programs, launches) of the last launch."""
    n_kv = run.model.n_kv_heads
    if kind == "decode":
        bm, bn, nw = block_m_for(G), 64, 4
        base = 1 * n_kv * B
    elif kind == "cascade":
        bm = block_m_for(B * G)
        bn, nw = (64, 4) if bm <= 64 else (128, 8)
        base = triton.cdiv(B * G, bm) * n_kv
    elif kind == "dense":
        bm, bn, nw = 128, 128, 8
        base = triton.cdiv(B * G, bm) * n_kv
    else:
        raise ValueError(kind)
    ns, ch = LAST_SPLIT.get("v", ("", ""))
    return dict(block_m=bm, block_n=bn, num_warps=nw, n_splits=ns, chunk=ch,
                programs=base * ns if ns != "" else "", launches=(2 if ns > 1 else 1) if ns != "" else "")


def _attn_grid(run):
    if run.args.smoke:
        return dict(dec_L=[40, 300], dec_B=[1, 3], pre_L=[100, 600], pre_B=[1, 2, 40], pre_B_small=[1, 40],
                    pre_L_store=[300], G5_L=[300], G5_B=[1, 8], G5_dec_B=[1])
    # decode: 2x-spaced L and B (the first H200 run's 4x grid could not interpolate the latency-bound
    # and many-program regimes: decode held out 7.0%/25.6%)
    return dict(dec_L=[16 * 2**i for i in range(11)], dec_B=[2**i for i in range(9)],
                pre_L=[1024, 4096, 16384, 32768],
                pre_B=[1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024],
                pre_B_small=[1, 4, 16, 64, 256, 1024], pre_L_store=[1024, 4096, 16384, 32768],
                G5_L=[4096, 16384], G5_B=[1, 4, 16, 64, 256, 1024], G5_dec_B=[1, 4, 16, 64, 256])


def _nq_for(run, G):
    return run.model.n_kv_heads * G


def s_decode(run):
    """Paged-path decode: B requests, each its own L tokens of KV, one query each."""
    pool, m = run.pool, run.model
    n_kv, d = m.n_kv_heads, m.head_dim
    gr = _attn_grid(run)
    pts = [(st, m.group_size, Lk, B) for st in ("slots", "pages16", "slab") for Lk in gr["dec_L"] for B in gr["dec_B"]]
    pts += [("slots", 5, Lk, B) for Lk in gr["G5_L"] for B in gr["G5_dec_B"]]
    for st, G, Lk, B in pts:
        if run.out_of_time("decode"):
            return
        n_q = n_kv * G
        kvbytes = B * Lk * n_kv * d * 2 * pool.k.element_size()
        if B * Lk > pool.S:
            continue
        k = copies_for(kvbytes)
        q = rnd(B, n_q, d, dtype=run.dtype)
        out, lse = torch.empty_like(q), torch.empty(B, n_q, device=DEV)
        fns = []
        for _ in range(k):
            kv = pool.layout(st, B, Lk)
            fns.append(lambda kv=kv: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, out=out, lse=lse,
                                                      check=False, max_kv_len=Lk))
        LAST_SPLIT.clear()
        t = time_calls(fns)
        lp = _launch_params("decode", run, G, B, Lk, n_q)
        r = dict(family="decode", kernel="split_kv", storage=st, page_size=PAGE[st], G=G, n_q=n_q, n_kv=n_kv, d=d,
                 B=B, L=Lk, M_eff=G, n_req=B, q_len=1, T=B, bytes=kvbytes + 2 * q.numel() * q.element_size(),
                 flops=4 * B * n_q * Lk * d, **lp, **t)
        run.row("attention.csv", ATTN_FIELDS, r)
        _print_attn(r)


# the engine's batch buckets between powers of two (gpu_backend/executor/rows.py `bucket`): its decode launches
# run at these row counts, which the power-of-two grid of `s_decode` only interpolates
BUCKETS_OFF_GRID = (3, 6, 12, 24, 48, 96, 160, 192, 224)
PADDED_FIELDS = ["storage", "G", "n_q", "n_kv", "d", "rows", "n_real", "L", "k", "reps", "median_us", "p10_us", "p90_us"]


def _padded(kv, n: int, rows: int):
    """``kv`` (n sequences) followed by rows - n empty ones, as the engine pads a decode launch."""
    extra = rows - n
    if isinstance(kv, L.Slabs):
        return L.Slabs(torch.cat([kv.start, kv.start[-1:].repeat(extra)]), torch.cat([kv.length, i32([0] * extra)]))
    ptr = torch.cat([kv.indptr, kv.indptr[-1:].repeat(extra)])
    if isinstance(kv, L.PageTable):
        return L.PageTable(ptr, kv.indices, torch.cat([kv.lens, i32([0] * extra)]), kv.page_size)
    return L.SlotLists(ptr, kv.indices)


def s_decode_buckets(run):
    """Section `decode_buckets`: the decode grid of `s_decode` at the engine's off-grid batch buckets (rows of
    attention.csv, family decode), and launches of those row counts holding fewer real requests, the rest
    empty, as the engine pads a batch to its bucket (decode_padded.csv)."""
    pool, m = run.pool, run.model
    n_kv, d, G = m.n_kv_heads, m.head_dim, m.group_size
    n_q = n_kv * G
    smoke = run.args.smoke
    Ls = [40] if smoke else [16 * 2**i for i in range(11)]
    buckets = (3, 6) if smoke else BUCKETS_OFF_GRID
    storages = ("slots", "slab") if smoke else ("slots", "pages16", "slab")
    full = [(st, Lk, B) for st in storages for Lk in Ls for B in buckets]
    pads = ((6, 5),) if smoke else ((6, 5), (12, 10), (24, 20), (48, 40), (96, 80), (96, 88), (128, 112), (192, 176))
    padded = [(st, Lk, b, n) for st in storages for Lk in sorted({Ls[0], Ls[-1]} if smoke else {Ls[-3], Ls[-1]})
              for b, n in pads]
    for st, Lk, B, n in [(st, Lk, B, B) for st, Lk, B in full] + padded:
        if run.out_of_time("decode_buckets"):
            return
        if n * Lk > pool.S:
            continue
        kvbytes = n * Lk * n_kv * d * 2 * pool.k.element_size()
        q = rnd(B, n_q, d, dtype=run.dtype)
        out, lse = torch.empty_like(q), torch.empty(B, n_q, device=DEV)
        fns = []
        for _ in range(copies_for(kvbytes)):
            kv = pool.layout(st, n, Lk)
            kv = kv if n == B else _padded(kv, n, B)
            fns.append(lambda kv=kv: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, out=out, lse=lse,
                                                      check=False, max_kv_len=Lk, mean_kv_len=Lk))
        LAST_SPLIT.clear()
        t = time_calls(fns)
        if n == B:
            lp = _launch_params("decode", run, G, B, Lk, n_q)
            r = dict(family="decode", kernel="split_kv", storage=st, page_size=PAGE[st], G=G, n_q=n_q, n_kv=n_kv,
                     d=d, B=B, L=Lk, M_eff=G, n_req=B, q_len=1, T=B,
                     bytes=kvbytes + 2 * q.numel() * q.element_size(), flops=4 * B * n_q * Lk * d, **lp, **t)
            run.row("attention.csv", ATTN_FIELDS, r)
            _print_attn(r)
        else:
            r = dict(storage=st, G=G, n_q=n_q, n_kv=n_kv, d=d, rows=B, n_real=n, L=Lk, **t)
            run.row("decode_padded.csv", PADDED_FIELDS, r)
            print(f"   decode padded {st:7s} L{Lk:6d} rows {B:4d} real {n:4d} {r['median_us']:9.1f} us", flush=True)


def _print_attn(r):
    print(f"   {r['family']:8s} {r['storage']:7s} G{r['G']} L{r['L']:6d} B{r['B']:5d} q{r['q_len']:5d} "
          f"splits {r.get('n_splits', '-')!s:>3} {r['median_us']:9.1f} us", flush=True)


def _prefix_points(run, path):
    gr = _attn_grid(run)
    G = run.model.group_size
    pts = [("slab", G, Lk, B) for Lk in gr["pre_L"] for B in gr["pre_B"]]
    pts += [("slab", 5, Lk, B) for Lk in gr["G5_L"] for B in gr["G5_B"]]
    if path == "cascade":
        pts += [(st, G, Lk, B) for st in ("slots", "pages16") for Lk in gr["pre_L_store"] for B in gr["pre_B_small"]]
    return pts


def s_prefix(run, path):
    """One prefix group: B decode queries stacked (M_eff = B * G rows per KV head) over L shared tokens."""
    pool, m = run.pool, run.model
    n_kv, d = m.n_kv_heads, m.head_dim
    fn_path = cascade_prefix_attention if path == "cascade" else dense_prefix_attention
    for st, G, Lk, B in _prefix_points(run, path):
        if run.out_of_time(path):
            return
        n_q = n_kv * G
        kvbytes = Lk * n_kv * d * 2 * pool.k.element_size()
        k = copies_for(kvbytes)
        q = rnd(B, n_q, d, dtype=run.dtype)
        gp = i32([0, B])
        out, lse = torch.empty_like(q), torch.empty(B, n_q, device=DEV)
        fns = []
        for _ in range(k):
            kv = pool.layout(st, 1, Lk)
            fns.append(lambda kv=kv: fn_path(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=gp, prefix=kv, out=out,
                                             lse=lse, check=False, max_group_size=B, max_kv_len=Lk))
        LAST_SPLIT.clear()
        t = time_calls(fns)
        lp = _launch_params(path, run, G, B, Lk, n_q)
        r = dict(family=path, kernel=path, storage=st, page_size=PAGE[st], G=G, n_q=n_q, n_kv=n_kv, d=d, B=B, L=Lk,
                 M_eff=B * G, n_req=B, q_len=1, T=B, bytes=kvbytes + 2 * q.numel() * q.element_size(),
                 flops=4 * B * n_q * Lk * d, **lp, **t)
        run.row("attention.csv", ATTN_FIELDS, r)
        _print_attn(r)


def s_extend(run):
    """Prefill / extend: n_req requests, q_len new tokens each, over c cached tokens (storage) + causal chunk."""
    if run.args.smoke:
        pts = [("slots", 0, 20, 2), ("pages16", 100, 20, 1), ("slab", 100, 40, 2)]
    else:
        pts = [("slab", 0, q, nr) for q in (16, 128, 512, 2048, 8192) for nr in (1, 4) if q * nr <= 8192]
        pts += [(st, c, q, nr) for st in ("pages16", "slots", "slab") for c in (1024, 4096, 16384)
                for q in (16, 128, 512, 2048) for nr in (1, 4)]
        # 8K-token chunks over a long cached prefix (a 16K prompt's later chunks): beyond 2K query tokens the model
        # extrapolated and priced them 2-8% over the real engine (reports/validation/)
        pts += [(st, c, 8192, 1) for st in ("slots", "slab") for c in (8192, 16384)]
    _extend_points(run, pts, "extend", "attention.csv")


def s_extend_shapes(run):
    """Prefill chunks as the engine's multi-agent steps are shaped, for the model's next terms (not fitted yet:
    extend_shapes.csv): one request's chunk of 2-6K tokens over a 16K prefix, and several requests over ONE shared
    prefix, read as a contiguous slot run (a HOT slab listed slot by slot, as the engine's extend reads it) or as
    random slots; the same shapes over distinct random contexts ('slots') beside them."""
    if run.args.smoke:
        pts = [(st, 100, 20, 2) for st in ("slotrun", "shared_slotrun", "shared_slots")]
    else:
        shapes = [(q, 1) for q in (256, 1024, 2048, 3072, 4096, 6144)] + [(q, 4) for q in (256, 1024, 2048)]
        shapes += [(q, 8) for q in (256, 1024)]
        pts = [(st, 16384, q, nr) for q, nr in shapes for st in ("slots", "slotrun", "shared_slotrun", "shared_slots")
               if nr > 1 or not st.startswith("shared")]
    _extend_points(run, pts, "extend_shapes", "extend_shapes.csv")


def s_extend_ragged(run):
    """Prefill launches of several requests of unequal chunk lengths (as the engine's eager steps are shaped), beside
    one request and equal splits of the same total, in both orders (the longest request first or last: the grid
    runs requests in order) over no cached prefix and over 4K cached tokens each (extend_ragged.csv, column
    q_lens; not fitted)."""
    if run.args.smoke:
        pts = [("slots", 0, q) for q in ((40,), (20, 20), (30, 10), (10, 30))]
    else:
        shares = [(1.0,), (0.5, 0.5), (0.25,) * 4, (0.7, 0.3), (0.3, 0.7), (0.5, 0.3, 0.2), (0.2, 0.3, 0.5),
                  (0.4, 0.3, 0.2, 0.1), (0.1, 0.2, 0.3, 0.4)]
        pts = [("slots", c, tuple(int(round(T * f / 64)) * 64 for f in sh))
               for c in (0, 4096) for T in (4096, 8192) for sh in shares]
    _extend_points(run, pts, "extend_ragged", "extend_ragged.csv", ragged=True)


def s_extend_order(run):
    """The ragged launches of extend_ragged (and one request alone) under each start order of the extend grid
    (gpu_backend.kernels.extend.ORDERS: the engine's order, each request's heaviest row blocks first, the heaviest
    row blocks of every request first), point by point (extend_order.csv, columns q_lens and order; not fitted).
    Prints each point's time under every order against the engine's."""
    if run.args.smoke:
        pts = [("slots", 0, (40,)), ("slots", 30, (10, 30))]
    else:
        shares = [(1.0,), (0.5, 0.5), (0.7, 0.3), (0.3, 0.7), (0.5, 0.3, 0.2), (0.2, 0.3, 0.5), (0.1, 0.2, 0.3, 0.4)]
        pts = [("slots", c, tuple(int(round(T * f / 64)) * 64 for f in sh))
               for c in (0, 4096) for T in (2048, 4096, 8192) for sh in shares]
    rows = []
    for pt in pts:  # every order of a point back to back: they see the same clock
        for order in ORDERS:
            rows += _extend_points(run, [pt], "extend_order", "extend_order.csv", ragged=True, order=order)
    us = {(r["L"], r["q_lens"], r["order"]): r["median_us"] for r in rows}
    others = [o for o in ORDERS if o != "in_order"]
    print("   cached  q_lens               in_order us  " + "  ".join(f"{o:>12s}" for o in others))
    for (c, q, o), base in us.items():
        if o == "in_order":
            ratios = [us.get((c, q, other), float("nan")) / base for other in others]
            print(f"   {c:6d}  {q:20s} {base:11.1f}  " + "  ".join(f"{x:12.3f}" for x in ratios), flush=True)


def _extend_points(run, pts, section: str, csv_name: str, ragged: bool = False, order: str | None = None) -> list:
    """Time extend_attention at each point, a row each: (storage, cached tokens, chunk tokens, requests), or with
    ``ragged`` (storage, cached tokens, each request's chunk tokens) and a ``q_lens`` column; ``order``: the grid's
    start order (an ``order`` column; default the kernel's own, no column). Returns the rows."""
    done = []
    pool, m = run.pool, run.model
    n_kv, d, G = m.n_kv_heads, m.head_dim, m.group_size
    n_q = n_kv * G
    for pt in pts:
        if run.out_of_time(section):
            return done
        st, c = pt[0], pt[1]
        qls = list(pt[2]) if ragged else [pt[2]] * pt[3]
        nr, ql, T = len(qls), max(qls), sum(qls)
        q = rnd(T, n_q, d, dtype=run.dtype)
        kn, vn = rnd(T, n_kv, d, dtype=run.dtype), rnd(T, n_kv, d, dtype=run.dtype)
        qo = i32([sum(qls[:i]) for i in range(nr + 1)])
        out, lse = torch.empty_like(q), torch.empty(T, n_q, device=DEV)
        kvbytes = (1 if st.startswith("shared") else nr) * c * n_kv * d * 2 * pool.k.element_size()  # distinct KV
        k = copies_for(kvbytes + 3 * q.numel() * q.element_size())
        fns = []
        for _ in range(k):
            kv = pool.layout(st, nr, c)
            fns.append(lambda kv=kv: extend_attention(q=q, k_new=kn, v_new=vn, qo_indptr=qo, k_cache=pool.k,
                                                      v_cache=pool.v, prefix=kv, out=out, lse=lse, check=False,
                                                      max_qo_len=ql, **({"order": order} if order else {})))
        t = time_calls(fns, min_reps=3)
        fl = 4 * d * n_q * sum(x * c + x * (x + 1) / 2 for x in qls)
        tiles = default_tiles(ql * G)  # what the launch ran: its longest chunk picks the tile
        bm = tiles["block_m"]
        r = dict(family="extend", kernel="extend", storage=st, page_size=PAGE.get(st, 1), G=G, n_q=n_q, n_kv=n_kv, d=d,
                 B=nr, L=c, M_eff=ql * G, n_req=nr, q_len=ql if not ragged else round(T / nr), T=T, block_m=bm,
                 block_n=tiles["block_n"], num_warps=tiles["num_warps"], n_splits=1, chunk=c,
                 programs=sum(triton.cdiv(x * G, bm) for x in qls) * n_kv,
                 launches=1, bytes=kvbytes + T * n_kv * d * 2 * 2 + 2 * q.numel() * 2, flops=fl, **t)
        if ragged:
            r["q_lens"] = ";".join(map(str, qls))
        if order:
            r["order"] = order
        run.row(csv_name, ATTN_FIELDS + (["q_lens"] if ragged else []) + (["order"] if order else []), r)
        _print_attn(r)
        done.append(r)
    return done
