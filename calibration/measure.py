"""Calibration microbenchmarks: raw timings of one model's operators on this GPU, as CSV.

    PYTHONUNBUFFERED=1 python -m calibration.measure --gpu h200 --model llama-3.1-8b --out DIR
    TRITON_INTERPRET=1 python -m calibration.measure --smoke --out /tmp/cal     # CPU, tiny sizes

Writes DIR/meta.json (date, commit, GPU, versions, command, ceilings) and DIR/{linear,attention,
overhead}.csv. Imports only torch, triton, gpu_backend, granisim.models (plain dataclasses) and
the standard library, so it runs on a bare GPU image without the simulator's dependencies.

What is timed (bf16, random data, CUDA-event medians with p10/p90 over graph replays):

* linear.csv — the model's linear operators as torch ops at its shapes over 1..16K tokens: the
  QKV, O, gate/up, down GEMMs and the LM head (``F.linear``), RMS norm, SiLU-and-mul, RoPE
  (rotate-half), residual add, embedding.
* attention.csv — every attention path and KV kernel through OUR Triton kernels: decode over
  page size 1 / pages of 16 / a slab; cascade over slab / slots / pages of 16; dense over a slab;
  extend (prefill) over each storage and an empty prefix; LSE merge; KV write; KV copy.
  Each row records the launch parameters the launcher chose (row tile, KV tile, warps, splits,
  chunk, programs), so a fit can follow the kernel's own rules.
* overhead.csv — one decode step's whole launch sequence (32 layers) run eagerly vs as a CUDA
  graph replay, plus the host work of building a step's metadata.

Timing rule: a point's operator is called ``k`` times in one CUDA graph, each call on a
different copy of its data (a different KV region / weight copy, like the model's layers), with
``k`` large enough that the ``k`` copies exceed the L2 several times over (at most 32); one
replay's time / ``k`` is one sample. Inter-kernel gaps inside a graph are included, host launch
cost is not (that is the overhead section's business).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton

from gpu_backend import layout as L
from gpu_backend.bench.timing import graph_of
from gpu_backend.checks import num_sms
from gpu_backend.kernels import split_kv
from gpu_backend.kernels.cascade import block_m_for, cascade_prefix_attention
from gpu_backend.kernels.decode import decode_attention
from gpu_backend.kernels import dense as _dense_mod
from gpu_backend.kernels.dense import dense_prefix_attention
from gpu_backend.kernels.extend import extend_attention
from gpu_backend.kernels.kv_write import write_kv
from gpu_backend.kernels.merge import merge_states
from granisim.models import get_model

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
L2_BYTES = 60 * 2**20  # refined from the device below
ROT_FACTOR = 3.0       # the k copies of a point's data add up to at least this many L2s
MAX_K = 32

ATTN_FIELDS = ["family", "kernel", "storage", "page_size", "G", "n_q", "n_kv", "d", "B", "L", "M_eff",
               "n_req", "q_len", "T", "block_m", "block_n", "num_warps", "n_splits", "chunk", "programs",
               "launches", "bytes", "flops", "k", "reps", "median_us", "p10_us", "p90_us"]  # k: calls per replay
LIN_FIELDS = ["op", "family", "n", "K", "N", "bytes", "flops", "k", "reps", "median_us", "p10_us", "p90_us"]
OVH_FIELDS = ["what", "B", "layers", "kernels", "reps", "median_us", "p10_us", "p90_us", "note"]


# ---- timing -------------------------------------------------------------------------------------
def _q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]


def stats(samples) -> dict:
    return {"median_us": statistics.median(samples), "p10_us": _q(samples, 0.1), "p90_us": _q(samples, 0.9),
            "reps": len(samples)}


MIN_REPLAY_MS = 0.05


def time_calls(fns, *, target_ms: float = 25.0, min_reps: int = 5, max_reps: int = 40, rep: int = 1) -> dict:
    """Per-call device time (us) of the calls `fns` (one per data copy), run back to back in one
    CUDA graph; samples are replays / len(fns). On CPU (smoke): wall clock of one pass."""
    k = len(fns)
    if not CUDA:
        t = time.perf_counter()
        for f in fns:
            f()
        us = (time.perf_counter() - t) * 1e6 / k
        return {"median_us": us, "p10_us": us, "p90_us": us, "reps": 1, "k": k}

    def all_():
        for f in fns:
            f()

    _, g = graph_of(all_)  # warm-up (compiles, caches) off the capture stream, then capture
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    torch.cuda.synchronize()
    est = max(e0.elapsed_time(e1), 1e-3)
    if est < MIN_REPLAY_MS and rep == 1:
        # a replay shorter than the host's time to issue one leaves the GPU waiting for the host (the
        # H200 run saw a ~13.5 us floor): repeat the calls inside the graph until a replay is long enough
        del g
        r = int(min(64, math.ceil(4 * MIN_REPLAY_MS / est)))
        return time_calls(fns * r, target_ms=target_ms, min_reps=min_reps, max_reps=max_reps, rep=r)
    n = int(min(max_reps, max(min_reps, target_ms / est)))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    samples = [a.elapsed_time(b) * 1e3 / k for a, b in ev]  # k counts the repeats too
    del g
    out = stats(samples)
    out["k"] = k
    return out


def _eager(fns, reps: int = 20) -> dict:
    """Per-call device time (us) of plain launches timed with events (long kernels only)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for f in fns:
            f()
        b.record()
        torch.cuda.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / len(fns))
    return stats(samples)


def copies_for(nbytes: float) -> int:
    """How many data copies a point rotates through (see the module docstring)."""
    if not CUDA:
        return 2
    return int(max(1, min(MAX_K, math.ceil(ROT_FACTOR * L2_BYTES / max(nbytes, 1.0)))))


# ---- data ---------------------------------------------------------------------------------------
class Pool:
    """Random K/V caches [slots, n_kv, d] (bf16 on the GPU, fp32 in CPU smoke runs)."""

    def __init__(self, slots: int, n_kv: int, d: int, dtype):
        g = torch.Generator(device=DEV).manual_seed(0)
        self.k = torch.randn(slots, n_kv, d, generator=g, device=DEV, dtype=dtype)
        self.v = torch.randn(slots, n_kv, d, generator=g, device=DEV, dtype=dtype)
        self.S = slots
        self.gen = torch.Generator(device=DEV).manual_seed(1)

    def randint(self, hi: int, n: int) -> torch.Tensor:
        return torch.randint(0, hi, (n,), generator=self.gen, device=DEV, dtype=torch.int32)

    def layout(self, storage: str, n: int, length: int) -> L.KVLayout:
        """n sequences of `length` tokens: 'slab' (back to back from a random start), 'slots' (page
        size 1, random slots anywhere in the pool), 'pages16' (random pages of 16)."""
        if storage == "slab":
            total = n * length
            assert total <= self.S, (n, length, self.S)
            base = int(torch.randint(0, self.S - total + 1, (1,)).item())
            return L.Slabs(i32([base + b * length for b in range(n)]), i32([length] * n))
        if storage == "slots":
            return L.SlotLists(i32([b * length for b in range(n + 1)]), self.randint(self.S, n * length))
        if storage.startswith("pages"):
            ps = int(storage[5:])
            per = -(-length // ps)
            return L.PageTable(i32([b * per for b in range(n + 1)]), self.randint(self.S // ps, n * per),
                               i32([length] * n), ps)
        raise ValueError(storage)


def i32(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int32, device=DEV)


def rnd(*shape, dtype, seed=None):
    return torch.randn(*shape, device=DEV, dtype=dtype)


PAGE = {"slab": 1, "slots": 1, "pages16": 16}


# ---- run state ------------------------------------------------------------------------------------
class Run:
    def __init__(self, args, model):
        self.args, self.model = args, model
        self.t0 = time.time()
        self.dtype = torch.bfloat16 if CUDA else torch.float32
        self.files = {}
        self.errors = []
        self.truncated = []
        self.deadline = float("inf")
        os.makedirs(args.out, exist_ok=True)

    def writer(self, name, fields):
        if name not in self.files:
            f = open(os.path.join(self.args.out, name), "w", newline="")
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            self.files[name] = (f, w)
        return self.files[name][1]

    def row(self, name, fields, r):
        self.writer(name, fields).writerow({k: r.get(k, "") for k in fields})
        self.files[name][0].flush()

    def out_of_time(self, section) -> bool:
        if time.time() > self.deadline:
            if section not in self.truncated:
                self.truncated.append(section)
                print(f"   {section}: out of its time share, rest of its grid skipped", flush=True)
            return True
        return False

    def elapsed(self):
        return time.time() - self.t0


# ---- sections -----------------------------------------------------------------------------------
def s_ceilings(run):
    if not CUDA:
        return {"note": "smoke: not measured"}
    n = 2**30 // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=DEV)
    dst = torch.empty_like(src)
    # plain launches, not a graph: a copy captured in a graph becomes a copy-engine node (2.76 TB/s on
    # the H200, where the SMs stream ~4.3 TB/s read + written)
    c = _eager([lambda: dst.copy_(src)])
    copy = 2 * n * 2 / (c["median_us"] * 1e-6)
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEV)
    m = time_calls([lambda: a @ b], min_reps=10)
    gemm = 2 * 8192**3 / (m["median_us"] * 1e-6)
    print(f"   copy {copy / 1e9:.0f} GB/s (read + written), bf16 8192^3 GEMM {gemm / 1e12:.0f} TFLOP/s", flush=True)
    return {"copy_Bps": copy, "copy_us": c, "gemm_flops": gemm, "gemm_us": m}


def token_grid(smoke):
    if smoke:
        return [1, 3, 16, 40]
    return [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 1536, 2048,
            3072, 4096, 6144, 8192, 12288, 16384]


def s_linear(run):
    m = run.model
    h, q, kv, d, inter, vocab = m.hidden, m.n_q_heads, m.n_kv_heads, m.head_dim, m.intermediate, m.vocab
    dt = run.dtype
    b = 2 if dt == torch.bfloat16 else 4
    if run.args.smoke:  # tiny stand-in shapes
        h, q, kv, d, inter, vocab = 64, 4, 1, 16, 128, 256
    gemms = [("qkv_proj", "attn_pre_proj", h, (q + 2 * kv) * d), ("o_proj", "attn_post_proj", q * d, h),
             ("mlp_up", "mlp_up_proj", h, 2 * inter), ("mlp_down", "mlp_down_proj", inter, h),
             ("lm_head", "lm_head", h, vocab)]
    ns = token_grid(run.args.smoke)
    nmax = ns[-1]
    # one activation buffer per shape, big enough for the largest n (activations of a layer stay in L2
    # at small n in a real model too); weights rotate through copies that exceed the L2
    for fam, op, K, N in gemms:
        wbytes = K * N * b
        k = copies_for(wbytes)
        ws = [rnd(N, K, dtype=dt) * 0.02 for _ in range(k)]
        x = rnd(nmax, K, dtype=dt)
        ys = [torch.empty(nmax, N, device=DEV, dtype=dt) for _ in range(k)]
        for n in ns:
            if run.out_of_time("linear"):
                return
            if fam == "lm_head" and n > 8192:
                continue
            xn = x[:n]
            fns = [(lambda w=w, y=y: torch.matmul(xn, w.t(), out=y[:n])) for w, y in zip(ws, ys)]
            t = time_calls(fns, min_reps=3 if n >= 4096 else 5)
            r = dict(op=op, family=fam, n=n, K=K, N=N, bytes=b * (K * N + n * (K + N)), flops=2 * n * K * N, **t)
            run.row("linear.csv", LIN_FIELDS, r)
        print(f"   {fam}: {len(ns)} token counts, {k} weight copies; n={ns[-1]}: {t['median_us']:.1f} us "
              f"(t = {run.elapsed():.0f} s)", flush=True)
        del ws, x, ys
    # element-wise: torch ops as an engine without fused kernels runs them
    x = rnd(nmax, h, dtype=dt)
    res = rnd(nmax, h, dtype=dt)
    nw = torch.ones(h, device=DEV, dtype=dt)
    gu = rnd(nmax, 2 * inter, dtype=dt)
    qk = rnd(nmax, q + kv, d, dtype=dt)
    pos = torch.arange(nmax, device=DEV)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=DEV, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(dt)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(dt)[:, None, :]
    emb = rnd(vocab, h, dtype=dt)
    ids = torch.randint(0, vocab, (nmax,), device=DEV)

    def rope(n):
        t = qk[:n]
        x1, x2 = t[..., : d // 2], t[..., d // 2:]
        rot = torch.cat([-x2, x1], -1)
        return t * cos[:n] + rot * sin[:n]

    ew = [("norm", "input_layernorm", lambda n: F.rms_norm(x[:n], (h,), nw, 1e-5), (2 * h + 0) * b),
          ("mlp_act", "mlp_act", lambda n: F.silu(gu[:n, :inter]) * gu[:n, inter:], 3 * inter * b),
          ("rope", "attn_rope", rope, 2 * (q + kv) * d * b),
          ("add", "add", lambda n: x[:n] + res[:n], 3 * h * b),
          ("embedding", "emb", lambda n: F.embedding(ids[:n], emb), 2 * h * b)]
    for fam, op, fn, per_tok in ew:
        for n in ns:
            if run.out_of_time("linear"):
                return
            t = time_calls([lambda n=n: fn(n)], min_reps=5)
            r = dict(op=op, family=fam, n=n, K=h, N=0, bytes=per_tok * n + (h * b if fam == "norm" else 0),
                     flops=0, **t)
            run.row("linear.csv", LIN_FIELDS, r)
        print(f"   {fam}: n={ns[-1]}: {t['median_us']:.1f} us", flush=True)


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
    pool, m = run.pool, run.model
    n_kv, d, G = m.n_kv_heads, m.head_dim, m.group_size
    n_q = n_kv * G
    if run.args.smoke:
        pts = [("slots", 0, 20, 2), ("pages16", 100, 20, 1), ("slab", 100, 40, 2)]
    else:
        pts = [("slab", 0, q, nr) for q in (16, 128, 512, 2048, 8192) for nr in (1, 4) if q * nr <= 8192]
        pts += [(st, c, q, nr) for st in ("pages16", "slots", "slab") for c in (1024, 4096, 16384)
                for q in (16, 128, 512, 2048) for nr in (1, 4)]
    for st, c, ql, nr in pts:
        if run.out_of_time("extend"):
            return
        T = nr * ql
        q = rnd(T, n_q, d, dtype=run.dtype)
        kn, vn = rnd(T, n_kv, d, dtype=run.dtype), rnd(T, n_kv, d, dtype=run.dtype)
        qo = i32([i * ql for i in range(nr + 1)])
        out, lse = torch.empty_like(q), torch.empty(T, n_q, device=DEV)
        kvbytes = nr * c * n_kv * d * 2 * pool.k.element_size()
        k = copies_for(kvbytes + 3 * q.numel() * q.element_size())
        fns = []
        for _ in range(k):
            kv = pool.layout(st, nr, c)
            fns.append(lambda kv=kv: extend_attention(q=q, k_new=kn, v_new=vn, qo_indptr=qo, k_cache=pool.k,
                                                      v_cache=pool.v, prefix=kv, out=out, lse=lse, check=False,
                                                      max_qo_len=ql))
        t = time_calls(fns, min_reps=3)
        fl = 4 * d * n_q * nr * (ql * c + ql * (ql + 1) / 2)
        r = dict(family="extend", kernel="extend", storage=st, page_size=PAGE[st], G=G, n_q=n_q, n_kv=n_kv, d=d,
                 B=nr, L=c, M_eff=ql * G, n_req=nr, q_len=ql, T=T, block_m=64, block_n=64, num_warps=4, n_splits=1,
                 chunk=c, programs=triton.cdiv(ql * G, 64) * n_kv * nr, launches=1,
                 bytes=kvbytes + T * n_kv * d * 2 * 2 + 2 * q.numel() * 2, flops=fl, **t)
        run.row("attention.csv", ATTN_FIELDS, r)
        _print_attn(r)


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


def s_overhead(run):
    """One decode step of the model (all layers): eager launches vs CUDA-graph replay, same work.
    Tiny batch so device time is small and the host's share shows."""
    m = run.model
    h, q, kv, d, inter, vocab, layers = m.hidden, m.n_q_heads, m.n_kv_heads, m.head_dim, m.intermediate, m.vocab, \
        m.num_layers
    if run.args.smoke:
        h, q, kv, d, inter, vocab, layers = 64, 4, 1, 16, 128, 256, 2
    dt = run.dtype
    B, ctx = 1, 64
    # one set of weights reused by every layer (host cost does not depend on it)
    wqkv, wo = rnd((q + 2 * kv) * d, h, dtype=dt) * 0.02, rnd(h, q * d, dtype=dt) * 0.02
    wgu, wd = rnd(2 * inter, h, dtype=dt) * 0.02, rnd(h, inter, dtype=dt) * 0.02
    nw = torch.ones(h, device=DEV, dtype=dt)
    emb = rnd(vocab, h, dtype=dt) * 0.02
    kc = torch.randn(layers, 4096, kv, d, device=DEV, dtype=dt)
    vc = torch.randn_like(kc)
    slots = L.SlotLists(i32([0, ctx + 1]), i32(list(range(ctx + 1))))
    new_slot = i32([ctx])
    ids = torch.zeros(B, dtype=torch.long, device=DEV)
    cos = torch.ones(B, 1, d, device=DEV, dtype=dt)
    sin = torch.zeros(B, 1, d, device=DEV, dtype=dt)

    def step():
        x = F.embedding(ids, emb)
        for li in range(layers):
            hn = F.rms_norm(x, (h,), nw, 1e-5)
            qkv = F.linear(hn, wqkv)
            qq = qkv[:, : q * d].view(B, q, d)
            kk = qkv[:, q * d:(q + kv) * d].view(B, kv, d)
            vv = qkv[:, (q + kv) * d:].reshape(B, kv, d)
            qr = qq * cos + torch.cat([-qq[..., d // 2:], qq[..., : d // 2]], -1) * sin
            kr = (kk * cos + torch.cat([-kk[..., d // 2:], kk[..., : d // 2]], -1) * sin).contiguous()
            write_kv(k_cache=kc[li], v_cache=vc[li], k=kr, v=vv.contiguous(), slots=new_slot, check=False)
            o, _ = decode_attention(q=qr.contiguous(), k_cache=kc[li], v_cache=vc[li], kv=slots, check=False,
                                    max_kv_len=ctx + 1)
            x = x + F.linear(o.view(B, q * d), wo)
            hn = F.rms_norm(x, (h,), nw, 1e-5)
            gu = F.linear(hn, wgu)
            x = x + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], wd)
        x = F.rms_norm(x, (h,), nw, 1e-5)
        return torch.argmax(F.linear(x, emb), -1)

    kernels_per_layer = 16  # roughly: launches per layer in step() (for the note only)
    step()
    if CUDA:
        torch.cuda.synchronize()
    # eager: wall clock per step, synchronised
    walls = []
    for _ in range(5 if run.args.smoke else 30):
        t = time.perf_counter()
        step()
        if CUDA:
            torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e6)
    run.row("overhead.csv", OVH_FIELDS, dict(what="eager_step_wall", B=B, layers=layers, kernels=kernels_per_layer * layers,
                                            note="eager launches of one decode step, wall clock incl. sync", **stats(walls)))
    if not CUDA:
        return
    # eager device span (events around the eager step)
    dev_eager = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        dev_eager.append(a.elapsed_time(b) * 1e3)
    run.row("overhead.csv", OVH_FIELDS, dict(what="eager_step_events", B=B, layers=layers, note="events around eager step",
                                            **stats(dev_eager)))
    _, g = graph_of(step)
    g.replay()
    torch.cuda.synchronize()
    gdev, gwall = [], []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        gdev.append(a.elapsed_time(b) * 1e3)
    for _ in range(30):
        t = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        gwall.append((time.perf_counter() - t) * 1e6)
    run.row("overhead.csv", OVH_FIELDS, dict(what="graph_step_events", B=B, layers=layers, note="device time of the replay",
                                            **stats(gdev)))
    run.row("overhead.csv", OVH_FIELDS, dict(what="graph_step_wall", B=B, layers=layers,
                                            note="wall clock of replay + sync", **stats(gwall)))
    # host work of a step's attention metadata: B requests' slot lists built from Python lists + H2D
    for Bm in (1, 64, 256):
        lists = [list(range(i * 1000, i * 1000 + 300 + i)) for i in range(Bm)]
        ts = []
        for _ in range(20):
            t = time.perf_counter()
            lens = [len(x) for x in lists]
            indptr = [0]
            for n in lens:
                indptr.append(indptr[-1] + n)
            flat = [s for x in lists for s in x]
            a = torch.tensor(indptr, dtype=torch.int32).to(DEV, non_blocking=True)
            b = torch.tensor(flat, dtype=torch.int32).to(DEV, non_blocking=True)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1e6)
        run.row("overhead.csv", OVH_FIELDS, dict(what="metadata_host", B=Bm, layers=0,
                                                note=f"slot lists of {Bm} requests (~{300 + Bm // 2} slots each) "
                                                     "from Python lists to int32 device tensors", **stats(ts)))
    print(f"   eager step {statistics.median(walls):.0f} us wall, graph replay {statistics.median(gwall):.0f} us wall "
          f"/ {statistics.median(gdev):.0f} us device", flush=True)


# ---- main -------------------------------------------------------------------------------------------
# share of --budget-s per section; deadlines are cumulative (a section may use what earlier ones left)
SECTIONS = [("ceilings", s_ceilings, 0.03), ("dense", lambda r: s_prefix(r, "dense"), 0.14),
            ("cascade", lambda r: s_prefix(r, "cascade"), 0.24), ("decode", s_decode, 0.14),
            ("linear", s_linear, 0.14), ("small", s_small, 0.06), ("extend", s_extend, 0.12),
            ("overhead", s_overhead, 0.08)]


def meta(args, model):
    m = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "commit": args.commit, "tree": args.tree,
         "command": "python -m calibration.measure " + " ".join(sys.argv[1:]),
         "gpu_flag": args.gpu, "model": model.name, "torch": torch.__version__, "triton": triton.__version__,
         "python": platform.python_version(), "smoke": bool(args.smoke), "cuda_available": CUDA,
         "timing": ("CUDA graph of k calls on k data copies (copies >= 3 L2s, k <= 32; the calls repeated inside the "
                    "graph when a replay would be shorter than 50 us); per-call time = replay / calls; "
                    "median, p10, p90 over replays; bf16 random normal data")}
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        m.update(gpu=p.name, sms=p.multi_processor_count, gpu_mem_bytes=p.total_memory, cuda=torch.version.cuda,
                 l2_bytes=getattr(p, "L2_cache_size", None), capability=list(torch.cuda.get_device_capability(0)))
    return m


def main(argv=None) -> int:
    global L2_BYTES
    ap = argparse.ArgumentParser(prog="python -m calibration.measure", description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default="h200", help="profile name the fit will write (recorded)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--tree", default=os.environ.get("TREE", ""), help="working-tree state note (recorded)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="time budget shared by the sections")
    ap.add_argument("--only", default="", help="comma-separated sections")
    ap.add_argument("--pool-slots", type=int, default=6 * 2**20)
    args = ap.parse_args(argv)
    model = get_model(args.model)
    run = Run(args, model)
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        L2_BYTES = getattr(p, "L2_cache_size", L2_BYTES) or L2_BYTES
    m = meta(args, model)
    m["sms_used_by_launchers"] = num_sms(DEV)
    slots = args.pool_slots if not args.smoke else 4096
    run.pool = Pool(slots, model.n_kv_heads, model.head_dim, run.dtype)
    m["pool_slots"] = slots
    m["sections"] = {}
    only = set(filter(None, args.only.split(",")))
    cum = 0.0
    for name, fn, share in SECTIONS:
        if only and name not in only and name != "ceilings":
            continue
        t = time.time()
        cum += share  # a section may use what earlier sections left unused
        run.deadline = run.t0 + cum * args.budget_s
        print(f"== {name} (t = {run.elapsed():.0f} s)", flush=True)
        try:
            res = fn(run)
            if name == "ceilings":
                m["ceilings"] = res
        except Exception as e:  # keep the other sections' rows
            traceback.print_exc()
            run.errors.append(f"{name}: {type(e).__name__}: {e}")
        m["sections"][name] = round(time.time() - t, 1)
        m["errors"], m["truncated"], m["wall_s"] = run.errors, run.truncated, round(run.elapsed(), 1)
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump(m, f, indent=1, default=str)
    for f, _ in run.files.values():
        f.close()
    print(f"done in {run.elapsed():.0f} s; truncated: {run.truncated}; errors: {run.errors}", flush=True)
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
