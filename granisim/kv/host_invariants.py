"""Invariants of the host KV tier, for fuzzers (granisim/kv/host_tier.py). Integers only.

:func:`replay` applies a plan's HOT compaction copies and host transfers, in their exact order, to
shadow arrays (the token last written into each GPU slot and each host slot), so that a run that
maps to the wrong data shows up. :func:`check_host_tier` checks, after any operation:

* host slots: the host pool's free slots and the host index's node slots tile ``[0, capacity)``
  (no host slot owned twice, none both owned and free, none lost);
* tiers apart: no GPU radix node is on the host pool, no host node on a GPU pool; every transfer
  names GPU slots inside the GPU budget and host slots inside the host pool (a node on host is
  never read by a kernel: plans read GPU slots only, and layouts are checked against the GPU shadow);
* host runs hold their own tokens (shadow): every host node's path maps to exactly its tokens;
* pricing: a transfer's ``pieces`` are its runs of host slots (1 when ``contiguous``: one run each side);
* bytes: ``bytes in == bytes dropped + bytes resident`` on the host.
"""

from __future__ import annotations

import numpy as np

from granisim.kv.sequence import path_slots, run_starts


def _path_tokens(node) -> np.ndarray:
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    return np.concatenate(keys[::-1]) if keys else np.empty(0, np.int64)


def replay(copies, transfers, gpu_shadow: np.ndarray, host_shadow: np.ndarray) -> None:
    """Apply ``copies`` (KVCopy) and ``transfers`` (KVTransfer, each after its ``after_copies``)."""
    ti = 0
    transfers = list(transfers)
    for k in range(len(copies) + 1):
        while ti < len(transfers) and transfers[ti].after_copies <= k:
            t = transfers[ti]
            if t.direction == "to_host":
                host_shadow[t.host_slots] = gpu_shadow[t.gpu_slots]
            else:
                gpu_shadow[t.gpu_slots] = host_shadow[t.host_slots]
            ti += 1
        if k < len(copies):
            c = copies[k]
            gpu_shadow[c.dst : c.dst + c.length] = gpu_shadow[c.src : c.src + c.length].copy()


def check_transfers(alloc, transfers) -> None:
    ht = alloc.host_tier
    for t in transfers:
        g, h = np.asarray(t.gpu_slots), np.asarray(t.host_slots)
        if g.size != h.size or t.nbytes != g.size * ht.cfg.bytes_per_token:
            raise AssertionError(f"transfer {t.direction}: {g.size} GPU slots, {h.size} host slots, {t.nbytes} B")
        if g.size and (g.min() < 0 or g.max() >= alloc.capacity):
            raise AssertionError(f"transfer {t.direction}: GPU slots outside [0, {alloc.capacity})")
        if h.size and (h.min() < 0 or h.max() >= ht.pool.capacity):
            raise AssertionError(f"transfer {t.direction}: host slots outside the host pool")
        # priced as what the engine does: one copy per run of host slots; a contiguous copy is one run each side
        runs = run_starts(h).size
        gpu_run = run_starts(g).size <= 1
        if t.pieces != (1 if t.contiguous else runs) or (t.contiguous and (runs != 1 or not gpu_run)):
            raise AssertionError(f"transfer {t.direction}: {t.pieces} pieces, contiguous={t.contiguous}, for "
                                 f"{runs} runs of host slots")


def check_host_tier(alloc, host_shadow: np.ndarray | None = None) -> None:
    ht = alloc.host_tier
    if ht is None:
        return
    cap = ht.pool.capacity
    seen = np.zeros(cap, np.int64)
    nodes = ht.index.nodes()
    for n in nodes:
        if n.pool != "host":
            raise AssertionError(f"host index node {n.id} is on pool {n.pool!r}")
        seen[np.asarray(n.value)] += 1
    free = np.flatnonzero(ht.pool.free_mask())
    seen[free] += 1
    if not (seen == 1).all():
        bad = int(np.flatnonzero(seen != 1)[0])
        raise AssertionError(f"host slot {bad} is owned or free {int(seen[bad])} times (must be exactly once)")
    for n in alloc.radix.nodes():
        if n.pool == "host":
            raise AssertionError(f"GPU radix node {n.id} is on the host pool")
    if ht.bytes_in != ht.bytes_dropped + ht.resident_bytes:
        raise AssertionError(f"host bytes: in {ht.bytes_in} != dropped {ht.bytes_dropped} + resident "
                             f"{ht.resident_bytes}")
    if host_shadow is not None:
        for n in nodes:
            if not np.array_equal(host_shadow[path_slots(n)], _path_tokens(n)):
                raise AssertionError(f"host node {n.id}: its host slots hold other tokens")
