"""COLD pool: a token-granular (page size 1) free list of slot ids.

Per-request suffixes and generated tokens live here: no internal fragmentation and no
copy on growth. Bulk allocate/free are vectorised with numpy; a boolean mask catches
double frees and foreign ids before any state changes.
"""

from __future__ import annotations

import numpy as np

SLOT_DTYPE = np.int64
# ndarray.min without its Python wrapper, and a count of True values (free_slots runs once per freed run)
_min, _count = np.minimum.reduce, np.count_nonzero


class ColdPool:
    """Free list over slots ``[slot_start, slot_start + capacity)``."""

    def __init__(self, capacity: int, slot_start: int = 0, name: str = "cold"):
        self._bounds(capacity, slot_start, name)
        # Stack of free slots; allocation pops from the top so ids are reused LIFO
        # (deterministic, and recently freed rows are likely still in cache on a GPU). Held as int32 where
        # the ids fit (half the memory); allocate() hands out SLOT_DTYPE ids either way.
        stack_dtype = np.int32 if slot_start + capacity <= np.iinfo(np.int32).max else SLOT_DTYPE
        self._stack = np.arange(slot_start + capacity - 1, slot_start - 1, -1, dtype=stack_dtype)
        self._top = self.capacity
        # slots counted as taken (``owe``) whose ids are not picked yet (``take_owed``): the top
        # ``_owed`` entries of the stack are spoken for
        self._owed = 0
        self._is_free = np.ones(self.capacity, dtype=bool)
        # Scratch for the O(n) repeated-id check in free_slots (not state: never read across calls).
        self._stamp = np.zeros(self.capacity, dtype=np.int32)
        self._arange = np.arange(1024, dtype=np.int32)

    def _bounds(self, capacity: int, slot_start: int, name: str) -> None:
        """Check and set the pool's name, capacity and first slot."""
        if not isinstance(capacity, (int, np.integer)) or capacity < 0:
            raise ValueError(f"{name} pool capacity must be an integer >= 0, got {capacity!r}")
        if slot_start < 0:
            raise ValueError(f"{name} pool slot_start must be >= 0, got {slot_start!r}")
        self.name = name
        self.capacity = int(capacity)
        self.slot_start = int(slot_start)

    @property
    def free(self) -> int:
        return self._top - self._owed

    @property
    def used(self) -> int:
        return self.capacity - self.free

    def owe(self, n: int) -> None:
        """Count ``n`` free slots as taken now; their ids are picked later by ``take_owed`` (for
        callers that need no ids yet: the cost executor's decode steps). Until then they show as
        free in ``free_mask``."""
        if n < 0 or n > self._top - self._owed:  # (self.free)
            raise ValueError(f"{self.name}: cannot owe {n} slots, only {self.free} free")
        self._owed += n

    def take_owed(self, n: int) -> np.ndarray:
        """Pick the ids of ``n`` owed slots (as ``allocate`` picks them)."""
        if not 0 <= n <= self._owed:
            raise ValueError(f"{self.name}: {n} slots asked for, {self._owed} owed")
        self._owed -= n
        return self.allocate(n)

    def owns(self, slots: np.ndarray) -> bool:
        s = np.asarray(slots)
        return bool(s.size == 0 or (s.min() >= self.slot_start and s.max() < self.slot_start + self.capacity))

    def allocate(self, n: int) -> np.ndarray:
        """Take ``n`` free slots; raises ValueError (state unchanged) if fewer are free."""
        if n < 0:
            raise ValueError(f"{self.name}: cannot allocate a negative number of slots ({n})")
        if n > self._top - self._owed:
            raise ValueError(f"{self.name}: asked for {n} slots, only {self.free} free")
        out = self._stack[self._top - n : self._top][::-1].astype(SLOT_DTYPE)  # a copy
        self._top -= n
        self._is_free[out - self.slot_start] = False
        return out

    def free_slots(self, slots: np.ndarray) -> None:
        """Return slots to the pool. Unknown, free or repeated ids raise ValueError; state unchanged."""
        s = np.asarray(slots, dtype=SLOT_DTYPE)
        n = s.size
        if n == 0:
            return
        idx = s - self.slot_start if self.slot_start else s
        if _min(idx) < 0:  # a negative index would wrap around to a slot of this pool
            raise self._not_in_pool(s)
        try:  # an id above the pool fails the gather (_is_free has one flag per slot; an int64 max is slow)
            already = self._is_free[idx]
        except IndexError:
            raise self._not_in_pool(s) from None
        if _count(already):  # count_nonzero: a fraction of logical_or.reduce's time on bools
            raise ValueError(f"{self.name}: slot id {int(s[already][0])} is already free (double free)")
        if n > 1:
            # each position writes its index; a repeated id keeps only its last writer's index
            # (O(n), unlike sorting with np.unique, which dominated bulk frees)
            order = self._order(n)
            stamp = self._stamp
            stamp[idx] = order
            repeated = stamp[idx] != order
            if _count(repeated):
                raise ValueError(f"{self.name}: slot id {int(s[repeated][0])} appears twice in one free")
        self._is_free[idx] = True
        self._stack[self._top : self._top + n] = s[::-1]
        self._top += n

    def _not_in_pool(self, s: np.ndarray) -> ValueError:
        bad = s[(s < self.slot_start) | (s >= self.slot_start + self.capacity)][0]
        return ValueError(f"{self.name}: slot id {int(bad)} is not in this pool")

    def _order(self, n: int) -> np.ndarray:
        """``np.arange(n, dtype=np.int32)``, a view of one kept arange (scratch, never written)."""
        order = self._arange
        if order.size < n:
            order = self._arange = np.arange(max(n, 2 * order.size), dtype=np.int32)
        return order[:n]

    def free_mask(self) -> np.ndarray:
        """Copy of the per-slot free flags (index = slot - slot_start)."""
        return self._is_free.copy()


class CountingColdPool(ColdPool):
    """A COLD pool that counts its slots without naming them: for a simulation in which nothing reads a
    COLD slot id (the cost executor without a host tier: pricing reads only HOT slabs' addresses, and
    only a host tier's transfers and the GPU executor's kernels read COLD ids). Every decision the
    allocator makes depends on how many slots are free, never on which, so a run with this pool makes
    the same decisions as one with :class:`ColdPool`; it skips picking, checking and stacking ids.

    ``allocate`` hands out placeholder ids (a read-only view of one arange: the same ids to every
    caller); ``free_slots`` checks only that no more than were taken come back. What needs real ids
    (``free_mask``, hence the fuzzers' ownership checks) is refused."""

    def __init__(self, capacity: int, slot_start: int = 0, name: str = "cold"):
        self._bounds(capacity, slot_start, name)
        self._top = self.capacity  # free slots (owed ones included)
        self._owed = 0
        self._ids = np.arange(slot_start, slot_start + capacity, dtype=SLOT_DTYPE)
        self._ids.flags.writeable = False

    def allocate(self, n: int) -> np.ndarray:
        if n < 0:
            raise ValueError(f"{self.name}: cannot allocate a negative number of slots ({n})")
        if n > self._top - self._owed:
            raise ValueError(f"{self.name}: asked for {n} slots, only {self.free} free")
        self._top -= n
        return self._ids[:n]

    def free_slots(self, slots: np.ndarray) -> None:
        n = len(slots)
        if self._top + n > self.capacity:
            raise ValueError(f"{self.name}: {n} slots freed, only {self.capacity - self._top} taken (double free)")
        self._top += n

    def free_mask(self) -> np.ndarray:
        raise ValueError(f"{self.name}: a counting pool names no free slots (build the allocator with slot ids)")
