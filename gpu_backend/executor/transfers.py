"""Host-tier KV copies on the real engine (a plan's ``transfers``, granisim/kv/host_tier.py).

:class:`HostKV` holds the host copy of K and V token-major: one ``(capacity, 2, layers, kv_heads, head_dim)``
tensor, so a host slot holds its token's K and V rows of every layer and a run of host slots is one block of
memory. It is allocated once at the tier's capacity (``[hardware] host_kv_gb``) when the executor is built, so
no step pays for it; on CUDA it is page-locked in place (``cudaHostRegister``: exactly the tier's bytes, where
torch's pinned allocator would round each block up to a power of two).

A transfer moves through a GPU staging buffer of the same token-major layout, a chunk of tokens at a time:
to host, the GPU gathers the chunk's rows of every layer into the staging buffer (a slice copy a layer for a
HOT slab, a gather by index for pages) and each run of consecutive host slots in it goes down as one copy;
to the GPU, the same in reverse. A HOT slab whose host slots are one run is one copy per chunk; pages cost a
copy per run of host slots (``KVTransfer.pieces``, what the cost model prices). Everything runs in order on
a side stream when on CUDA. :func:`apply_copies_and_transfers` applies a plan's HOT compaction copies and its
transfers in the allocator's order (each transfer after its ``after_copies`` copies).
"""

from __future__ import annotations

import numpy as np
import torch

from granisim.kv.sequence import run_starts

STAGE_BYTES = 256 << 20  # the GPU staging buffer: 2,048 tokens of Llama-3.1-8B's K and V


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
                 capacity: int, stage_bytes: int = STAGE_BYTES):
        if capacity < 1:
            raise ValueError(f"host tier capacity must be at least one token, got {capacity}")
        self.device = device  # the GPU side's device
        self.capacity = int(capacity)
        row = (2, num_layers, n_kv_heads, head_dim)
        per_token = int(np.prod(row)) * torch.empty(0, dtype=dtype).element_size()
        need = self.capacity * per_token
        have = _available_bytes()
        if have is not None and need > 0.9 * have:
            raise ValueError(f"hardware.host_kv_gb: the host tier needs {need / 1e9:.1f} GB of host memory, this "
                             f"machine has {have / 1e9:.1f} GB available; lower host_kv_gb")
        self.pin = device.type == "cuda"
        self.buf = torch.empty((self.capacity, *row), dtype=dtype)
        self.chunk = max(1, min(self.capacity, stage_bytes // per_token))
        self.stage = torch.empty((self.chunk, *row), dtype=dtype, device=device)
        self.stream = None
        if self.pin:
            err = torch.cuda.cudart().cudaHostRegister(self.buf.data_ptr(), need, 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of {need / 1e9:.1f} GB failed ({err})")
            self.stream = torch.cuda.Stream(device)
        self.slab_copies = 0  # transfers of a GPU run to one host run
        self.page_copies = 0  # the others
        self.host_copies = 0  # copies across the link (one per run of host slots per chunk)

    def move(self, t, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]) -> None:
        """One transfer, every layer, through the staging buffer a chunk at a time."""
        gpu, host = np.asarray(t.gpu_slots, np.int64), np.asarray(t.host_slots, np.int64)
        if gpu.size == 0:
            return
        if gpu.size != host.size:
            raise ValueError(f"transfer of {gpu.size} GPU slots to {host.size} host slots")
        if host.min() < 0 or host.max() >= self.capacity:
            raise ValueError(f"host slots {host.min()}..{host.max()} outside the tier's {self.capacity}")
        gpu_run = run_starts(gpu).size == 1
        runs = run_starts(host)
        caches = (k_cache, v_cache)
        for c in range(0, gpu.size, self.chunk):
            e = min(gpu.size, c + self.chunk)
            stage = self.stage[: e - c]
            g = slice(int(gpu[c]), int(gpu[c]) + e - c) if gpu_run else torch.as_tensor(gpu[c:e], device=self.device)
            # the chunk's runs of host slots: [lo, hi) positions in the transfer
            inner = runs[np.searchsorted(runs, c, "right") : np.searchsorted(runs, e, "left")]
            cuts = [c, *inner.tolist(), e]
            if t.direction == "to_host":
                for side, cache in enumerate(caches):
                    for layer, rows in enumerate(cache):
                        stage[:, side, layer] = rows[g]
                for lo, hi in zip(cuts, cuts[1:]):
                    h0 = int(host[lo])
                    self.buf[h0 : h0 + hi - lo].copy_(stage[lo - c : hi - c], non_blocking=self.pin)
            else:
                for lo, hi in zip(cuts, cuts[1:]):
                    h0 = int(host[lo])
                    stage[lo - c : hi - c].copy_(self.buf[h0 : h0 + hi - lo], non_blocking=self.pin)
                for side, cache in enumerate(caches):
                    for layer, rows in enumerate(cache):
                        if gpu_run:
                            rows[g] = stage[:, side, layer]
                        else:
                            rows.index_copy_(0, g, stage[:, side, layer])
            self.host_copies += len(cuts) - 1
        if gpu_run and runs.size == 1:
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
