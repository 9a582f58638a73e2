"""Section `overhead`: one decode step's whole launch sequence, eager vs CUDA-graph replay, and the host
work of building a step's metadata."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from gpu_backend.kernels import layout as L
from gpu_backend.bench.timing import graph_of
from gpu_backend.kernels.decode import decode_attention
from gpu_backend.kernels.kv_write import write_kv

from .common import CUDA, DEV, OVH_FIELDS, i32, rnd, stats

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
