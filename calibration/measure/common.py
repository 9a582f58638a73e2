"""Shared by the calibration sections: device, timing rules, random data, the run's CSV files."""
from __future__ import annotations

import csv
import math
import os
import statistics
import time

import torch

from gpu_backend.kernels import layout as L
from gpu_backend.bench.timing import graph_of

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
L2_BYTES = 60 * 2**20  # refined from the device (cli.main)
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
        size 1, random slots anywhere in the pool), 'pages16' (random pages of 16); slot lists of a contiguous
        run each ('slotrun'), or one list all n share ('shared_slotrun', 'shared_slots')."""
        if storage == "slab":
            total = n * length
            assert total <= self.S, (n, length, self.S)
            base = int(torch.randint(0, self.S - total + 1, (1,)).item())
            return L.Slabs(i32([base + b * length for b in range(n)]), i32([length] * n))
        if storage == "slots":
            return L.SlotLists(i32([b * length for b in range(n + 1)]), self.randint(self.S, n * length))
        if storage in ("slotrun", "shared_slotrun", "shared_slots"):
            # slot lists: each sequence a contiguous run ('slotrun'), or all n sequences one shared list
            shared = storage.startswith("shared")
            m = length if shared else n * length
            if storage == "shared_slots":
                ids = self.randint(self.S, m)
            else:
                base = int(torch.randint(0, self.S - m + 1, (1,), generator=self.gen, device=DEV).item())
                ids = torch.arange(base, base + m, device=DEV, dtype=torch.int32)
            return L.SlotLists(i32([b * length for b in range(n + 1)]), ids.repeat(n) if shared else ids)
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
def write_csv(path, fields, rows) -> None:
    """A standalone section's rows as one CSV file (the folder made if needed)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)


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
