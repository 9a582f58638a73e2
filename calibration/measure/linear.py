"""Section `linear` (and the `ceilings`): the model's linear operators as torch ops over 1..16K tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import CUDA, DEV, LIN_FIELDS, _eager, copies_for, rnd, time_calls


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
