"""Host-tier KV copies on the real engine (a plan's ``transfers``, granisim/kv/host_tier.py).

:class:`HostKV` holds the host copy of K and V: one ``(layers, capacity, kv_heads, head_dim)`` tensor a side,
allocated once at the tier's capacity (``[hardware] host_kv_gb``) when the executor is built, so no step pays
for it. On CUDA the memory is page-locked in place (``cudaHostRegister``: exactly the tier's bytes, where
torch's pinned allocator would round each block up to a power of two) and slab copies run asynchronously on
a side stream. :func:`apply_copies_and_transfers` applies a plan's HOT compaction copies and its transfers in
the allocator's order (each transfer after its ``after_copies`` copies): a run of slots on both sides moves as
one slice copy per layer (a HOT slab), anything else as one gather / scatter by index (page-granular KV).
"""

from __future__ import annotations

import numpy as np
import torch


def _run_start(slots: np.ndarray) -> int | None:
    """First slot of a consecutive ascending run, else None."""
    if slots.size and slots[-1] - slots[0] == slots.size - 1 and (slots.size < 2 or (np.diff(slots) == 1).all()):
        return int(slots[0])
    return None


def _available_bytes() -> int | None:
    """Host memory the kernel reports available (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class HostKV:
    """K/V rows in host memory for ``capacity`` host slots, every layer."""

    def __init__(self, num_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int):
        if capacity < 1:
            raise ValueError(f"host tier capacity must be at least one token, got {capacity}")
        self.device = device  # the GPU side's device
        self.capacity = int(capacity)
        shape = (num_layers, self.capacity, n_kv_heads, head_dim)
        need = 2 * int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        have = _available_bytes()
        if have is not None and need > 0.9 * have:
            raise ValueError(f"hardware.host_kv_gb: the host tier needs {need / 1e9:.1f} GB of host memory, this "
                             f"machine has {have / 1e9:.1f} GB available; lower host_kv_gb")
        self.pin = device.type == "cuda"
        self.k = torch.empty(shape, dtype=dtype)
        self.v = torch.empty(shape, dtype=dtype)
        self.stream = None
        if self.pin:
            rt = torch.cuda.cudart()
            for t in (self.k, self.v):
                err = rt.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
                if int(err) != 0:
                    raise RuntimeError(f"cudaHostRegister of {need / 2e9:.1f} GB failed ({err})")
            self.stream = torch.cuda.Stream(device)
        self.slab_copies = 0
        self.page_copies = 0

    def move(self, t, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> None:
        """One transfer, every layer: a slice copy when both sides are runs, else by index."""
        gpu, host = np.asarray(t.gpu_slots, np.int64), np.asarray(t.host_slots, np.int64)
        if gpu.size == 0:
            return
        if host.min() < 0 or host.max() >= self.capacity:
            raise ValueError(f"host slots {host.min()}..{host.max()} outside the tier's {self.capacity}")
        g0, h0, n = _run_start(gpu), _run_start(host), gpu.size
        if g0 is not None and h0 is not None:  # a HOT slab: one slice copy a layer, asynchronous when pinned
            for cache, hostside in ((k_cache, self.k), (v_cache, self.v)):
                for layer, hbuf in zip(cache, hostside):
                    if t.direction == "to_host":
                        hbuf[h0 : h0 + n].copy_(layer[g0 : g0 + n], non_blocking=self.pin)
                    else:
                        layer[g0 : g0 + n].copy_(hbuf[h0 : h0 + n], non_blocking=self.pin)
            self.slab_copies += 1
            return
        # pages: the host side is indexed on the CPU, so earlier asynchronous copies must have landed
        if self.stream is not None:
            self.stream.synchronize()
        gi, hi = torch.as_tensor(gpu, device=self.device), torch.as_tensor(host)
        for cache, hostside in ((k_cache, self.k), (v_cache, self.v)):
            if t.direction == "to_host":
                hostside.index_copy_(1, hi, torch.stack([layer.index_select(0, gi) for layer in cache]).cpu())
            else:
                rows = hostside.index_select(1, hi).to(self.device)
                for layer, r in zip(cache, rows):
                    layer.index_copy_(0, gi, r)
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
