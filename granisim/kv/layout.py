"""Data that crosses from the allocator into a batch plan: layouts, segments, stats.

Frozen and slotted; integers and numpy int arrays only (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from granisim.kv.hot_pool import KVCopy

__all__ = ["KVCopy", "KVSegment", "RequestLayout", "PoolStats", "AllocatorStats"]


@dataclass(frozen=True, slots=True)
class KVSegment:
    """A run of a request's tokens, in token order, all in one pool.

    ``slab`` is ``(start, length)`` when the slots are one contiguous HOT run.
    """

    pool: str
    slots: np.ndarray
    slab: tuple[int, int] | None = None

    def __len__(self) -> int:
        return int(self.slots.size)


@dataclass(frozen=True, slots=True)
class RequestLayout:
    """Where every cached token of one request lives, in token order.

    The first ``shared_len`` tokens are the request's prefix group's shared prefix
    (identified by radix node id ``group``); the rest is per request.
    """

    rid: int
    segments: tuple[KVSegment, ...]
    num_tokens: int
    shared_len: int
    group: int | None

    def slots(self) -> np.ndarray:
        if not self.segments:
            return np.empty(0, np.int64)
        return np.concatenate([s.slots for s in self.segments])

    def slots_from(self, start: int) -> np.ndarray:
        """Slots of tokens ``start..`` without materialising the ones before (a long shared prefix)."""
        out, at = [], 0
        for s in self.segments:
            if at + len(s.slots) > start:
                out.append(s.slots[max(0, start - at):])
            at += len(s.slots)
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def shared_slots(self) -> np.ndarray:
        return self.slots()[: self.shared_len]

    def private_slots(self) -> np.ndarray:
        return self.slots_from(self.shared_len)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Token counts of one pool: free + used + cached == capacity."""

    capacity: int
    free: int
    used: int  # owned by live requests or by tree nodes they lock
    cached: int  # owned by unlocked tree nodes (evictable)
    fragmentation: float  # HOT: external (1 - largest free run / free); paged: internal (reserved unused / used)


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    policy: str
    pools: dict[str, PoolStats]
    lookups: int
    hit_tokens: int
    lookup_tokens: int
    evictions: int
    evicted_tokens: int
    compactions: int
    copied_tokens: int
    hot_placements: int
    hot_fallbacks: int
    hot_evictions: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0
