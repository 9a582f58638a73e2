"""Benchmark problems on the device: a KV pool, prefixes and per-request KV in each storage."""
from __future__ import annotations

import torch

from ..kernels import layout as L

N_KV, D = 8, 128  # Llama-3.1-8B / Qwen-2.5 KV heads and head dim
KV_BYTES_PER_TOKEN = N_KV * D * 2 * 2  # K and V, bf16


def dev():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Pool:
    """k_cache, v_cache [num_slots, N_KV, D] of random bf16 (fp16 in CPU smoke runs)."""

    def __init__(self, num_slots: int, seed: int = 0, n_kv: int = N_KV, d: int = D):
        self.dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float16
        g = torch.Generator(device=dev()).manual_seed(seed)
        self.k = torch.randn(num_slots, n_kv, d, generator=g, device=dev(), dtype=self.dtype)
        self.v = torch.randn(num_slots, n_kv, d, generator=g, device=dev(), dtype=self.dtype)
        self.num_slots = num_slots
        self.gen = g

    def perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen, device=dev())


def i32(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int32, device=dev())


def seqs(pool: Pool, kind: str, n: int, length: int, *, offset: int = 0) -> L.KVLayout:
    """n sequences of `length` tokens in `kind` storage:
    'slab'    — contiguous runs (one per sequence, back to back from a random start);
    'slots'   — page size 1, slots drawn at random from the whole pool (a churned free list);
    'seq'     — page size 1, slot lists that happen to be consecutive (control for 'slots');
    'pages16' — page size 16, random pages.
    Sequences get distinct slots while n * length fits the pool, and wrap around after."""
    S = pool.num_slots
    total = n * length
    if kind == "slab":
        need = min(total, S)
        start = int(torch.randint(0, S - need + 1, (1,)).item()) if S > need else 0
        starts = [(start + b * length) % max(S - length + 1, 1) for b in range(n)]
        return L.Slabs(i32(starts), i32([length] * n))
    if kind in ("slots", "seq"):
        order = pool.perm(S) if kind == "slots" else torch.arange(S, device=dev())
        pos = (torch.arange(total, device=dev()) + offset) % S
        return L.SlotLists(i32(torch.arange(n + 1, device=dev()) * length), order[pos].to(torch.int32))
    if kind.startswith("pages"):
        ps = int(kind[5:])
        n_pages = S // ps
        per = -(-length // ps)
        order = pool.perm(n_pages)
        pos = (torch.arange(n * per, device=dev()) + offset // ps) % n_pages
        return L.PageTable(i32(torch.arange(n + 1, device=dev()) * per), order[pos].to(torch.int32),
                           i32([length] * n), ps)
    raise ValueError(kind)


def queries(t: int, n_q: int, dtype, seed: int = 1, d: int = D) -> torch.Tensor:
    g = torch.Generator(device=dev()).manual_seed(seed)
    return torch.randn(t, n_q, d, generator=g, device=dev(), dtype=dtype)
