"""The allocator protocol: what an allocator answers to the scheduler and exposes to the fuzzer.

:class:`AllocatorProtocol` is a :class:`typing.Protocol` (structural: implement the
methods, no base class needed). The first group is what the scheduler asks;
the second is read-only introspection the fuzzer
(:func:`granisim.experiments.fuzz.allocator_machine`) uses to check invariants. The fuzzer
reads nothing else, so any allocator implementing these methods can be fuzzed
(see ``docs/fuzzing.md`` and ``tests/granisim/test_fuzz_protocol.py``).

Slot ids are integers in ``[0, capacity)``; every slot is at all times exactly one of
free, owned by a live request, or owned by a cached prefix (a :class:`CachedRun`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from granisim.kv.layout import AllocatorStats, KVCopy, RequestLayout

__all__ = ["AllocatorProtocol", "CachedRun"]


@dataclass(frozen=True, slots=True)
class CachedRun:
    """One cached run of a prefix tree: ``tokens`` follow the run ``parent`` (0 = the root)
    and live in ``slots`` of ``pool``; ``locked`` while a live request (or a caller) holds it."""

    id: int
    parent: int
    tokens: np.ndarray
    slots: np.ndarray
    pool: str
    locked: bool


@runtime_checkable
class AllocatorProtocol(Protocol):
    capacity: int  # slots in [0, capacity)
    page_size: int  # granularity of private slots and of cached prefixes (1 = token)

    # ---- what the scheduler asks ----------------------------------------------------------
    def can_admit(self, tokens: np.ndarray, shared_len: int = 0, reserve: int = 0) -> bool:
        """Would the uncached part of ``tokens`` plus ``reserve`` more tokens fit now? A yes is a
        promise: right after ``admit``, extending by all of that must succeed."""

    def admit(self, rid: int, tokens: np.ndarray, shared_len: int = 0) -> int:
        """Start request ``rid``; returns how many leading tokens are already cached (< len)."""

    def can_extend(self, demands: dict[int, int]) -> bool:
        """Would every ``extend(rid, n)`` of ``demands`` succeed, one after the other?"""

    def extend(self, rid: int, n: int) -> np.ndarray:
        """Slots for the next ``n`` tokens of ``rid`` (may evict cached prefixes)."""

    def can_extend_all(self, rids: list[int], n: int) -> bool:
        """``can_extend({rid: n for rid in rids})`` (the scheduler's decode step)."""

    def extend_all(self, rids: list[int], n: int) -> list[np.ndarray]:
        """``[extend(rid, n) for rid in rids]`` (the scheduler's decode step)."""

    def cache_prefix(self, rid: int, tokens: np.ndarray) -> None:
        """Make the first ``len(tokens)`` computed tokens of ``rid`` matchable by others."""

    def release(self, rid: int, tokens: np.ndarray | None = None) -> None:
        """End ``rid``: with ``tokens`` (finished) cache them first; without (preempted) free."""

    def evict(self, n: int) -> int:
        """Evict up to ``n`` cached private-pool tokens, least recently used first; returns freed."""

    def clear_cache(self) -> int:
        """Evict every unlocked cached prefix; returns tokens freed."""

    def compact(self) -> list[KVCopy]:
        """Defragment (may move cached K/V: the copies are also queued for ``take_copies``)."""

    def take_copies(self) -> list[KVCopy]:
        """K/V copies (src, dst, length) to apply, in order, before the next step."""

    def rebalance(self) -> None:
        """Let the allocator move pool boundaries (a no-op for most)."""

    def layout(self, rid: int) -> RequestLayout:
        """Where the request's computed tokens live, in token order."""

    def stats(self) -> AllocatorStats:
        """Counts per pool (free + used + cached == capacity) and event counters."""

    # ---- what the fuzzer reads --------------------------------------------------------------
    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """Slots of the longest cached prefix of ``tokens`` (counts as a use for LRU)."""

    def ownership(self) -> list[tuple[str, int, str, np.ndarray]]:
        """(owner kind 'request' | 'node', owner id, pool, slots) for every owned slot run."""

    def cached_runs(self) -> list[CachedRun]:
        """Every cached run of the prefix tree (the ``node`` owners of :meth:`ownership`)."""

    def free_slots(self) -> dict[str, np.ndarray]:
        """Free slot ids per pool."""

    def pool_bounds(self) -> dict[str, tuple[int, int]]:
        """Slot range ``[start, stop)`` of every pool (disjoint; may move, across free slots only)."""
