"""Host-tier KV copies on the real engine (a plan's ``transfers``, granisim/kv/host_tier.py).

:class:`HostKV` holds the host copy of K and V per layer (pinned memory on CUDA, so copies run
asynchronously on a side stream; plain memory on the CPU). :func:`apply_copies_and_transfers` applies a
plan's HOT compaction copies and its transfers in the allocator's order (each transfer after its
``after_copies`` copies): a run of slots on both sides moves as one slice copy per layer (a HOT slab),
anything else as a gather / scatter by index per layer (page-granular KV).
"""

from __future__ import annotations

import numpy as np
import torch


def _run_start(slots: np.ndarray) -> int | None:
    """First slot of a consecutive ascending run, else None."""
    if slots.size and slots[-1] - slots[0] == slots.size - 1 and (slots.size < 2 or (np.diff(slots) == 1).all()):
        return int(slots[0])
    return None


class HostKV:
    """K/V rows in host memory, one tensor pair per layer; grows to the highest host slot asked for."""

    def __init__(self, num_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (n_kv_heads, head_dim)
        self.dtype = dtype
        self.device = device  # the GPU side's device
        self.pin = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.pin else None
        self.k: list[torch.Tensor] = [self._empty(0) for _ in range(num_layers)]
        self.v: list[torch.Tensor] = [self._empty(0) for _ in range(num_layers)]
        self.slab_copies = 0
        self.page_copies = 0

    def _empty(self, n: int) -> torch.Tensor:
        return torch.zeros((n, *self.shape), dtype=self.dtype, pin_memory=self.pin)

    def ensure(self, n: int) -> None:
        if self.k and self.k[0].shape[0] >= n:
            return
        size = max(n, 2 * (self.k[0].shape[0] if self.k else 0))
        for side in (self.k, self.v):
            for i, old in enumerate(side):
                new = self._empty(size)
                new[: old.shape[0]] = old
                side[i] = new

    def move(self, t, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> None:
        """One transfer, every layer: a slice copy when both sides are runs, else by index."""
        gpu, host = np.asarray(t.gpu_slots, np.int64), np.asarray(t.host_slots, np.int64)
        if gpu.size == 0:
            return
        self.ensure(int(host.max()) + 1)
        g0, h0, n = _run_start(gpu), _run_start(host), gpu.size
        block = g0 is not None and h0 is not None
        gi = None if block else torch.as_tensor(gpu, device=self.device)
        hi = None if block else torch.as_tensor(host)
        for cache, hostside in ((k_cache, self.k), (v_cache, self.v)):
            for layer, hbuf in zip(cache, hostside):
                if t.direction == "to_host":
                    if block:
                        hbuf[h0 : h0 + n].copy_(layer[g0 : g0 + n], non_blocking=self.pin)
                    else:
                        hbuf.index_copy_(0, hi, layer.index_select(0, gi).to("cpu", non_blocking=self.pin))
                elif block:
                    layer[g0 : g0 + n].copy_(hbuf[h0 : h0 + n], non_blocking=self.pin)
                else:
                    layer.index_copy_(0, gi, hbuf.index_select(0, hi).to(self.device, non_blocking=self.pin))
        if block:
            self.slab_copies += 1
        else:
            self.page_copies += 1


def apply_copies_and_transfers(plan, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], host: HostKV) -> None:
    """A plan's compaction copies and host transfers, interleaved as the allocator made them."""
    stream = host.stream
    ctx = torch.cuda.stream(stream) if stream is not None else None
    if ctx is not None:
        stream.wait_stream(torch.cuda.current_stream(host.device))
        ctx.__enter__()
    try:
        transfers, ti = plan.transfers, 0
        for k in range(len(plan.copies) + 1):
            while ti < len(transfers) and transfers[ti].after_copies <= k:
                host.move(transfers[ti], k_cache, v_cache)
                ti += 1
            if k < len(plan.copies):
                c = plan.copies[k]
                for cache in (*k_cache, *v_cache):
                    cache[c.dst : c.dst + c.length] = cache[c.src : c.src + c.length].clone()
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
            torch.cuda.current_stream(host.device).wait_stream(stream)
