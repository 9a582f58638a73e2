"""The movable HOT/COLD boundary of ``granikv`` with ``hot_fraction = "adaptive"``.

Slot space stays one KV buffer ``[0, capacity)``: HOT owns ``[0, b)``, COLD owns
``[b, capacity)``. The boundary ``b`` moves only across *free* slots, so no K/V ever
moves because of it:

* HOT grows by taking the free run at COLD's low end (``ElasticColdPool.give_low``);
  COLD hands out its highest free slots first, so its low end stays free for as long as
  its occupancy allows (``prefer_high`` re-sorts the free stack when HOT is blocked).
* HOT shrinks by giving its free run at the top (after LRU eviction of unlocked slabs
  and a compaction, whose copies are queued like any other) to COLD
  (``ElasticColdPool.take_low``), where those slots are used last.

Everything here is integer bookkeeping; the policy that decides where ``b`` should be
lives in :class:`granisim.kv.hot_slabs.HotSlabs` (``can_place`` grows HOT, ``rebalance``
shrinks it towards :class:`granisim.kv.hot_demand.HotDemand`).
"""

from __future__ import annotations

import numpy as np

from granisim.kv.cold_pool import SLOT_DTYPE, ColdPool
from granisim.kv.hot_pool import HotPool


class ElasticHotPool(HotPool):
    def top_free_run(self) -> int:
        """Free slots at the top end (next to the boundary)."""
        if self._free_starts and self._free_starts[-1] + self._free_lens[-1] == self.slot_start + self.capacity:
            return self._free_lens[-1]
        return 0

    def grow_top(self, n: int) -> None:
        """Take ``n`` slots just above the top (handed over by COLD) as free space."""
        if n <= 0:
            return
        end = self.slot_start + self.capacity
        self.capacity += n
        self._insert_free(end, n)

    def shrink_top(self, n: int) -> None:
        """Give away the top ``n`` slots; they must be free."""
        if n <= 0:
            return
        if n > self.top_free_run():
            raise ValueError(f"hot pool: cannot give {n} top slots, only {self.top_free_run()} free there")
        self.capacity -= n
        if self._free_lens[-1] == n:
            del self._free_starts[-1], self._free_lens[-1]
        else:
            self._free_lens[-1] -= n


class ElasticColdPool(ColdPool):
    """A COLD pool whose low end can be handed to HOT and taken back.

    Allocation pops the top of the free stack; the initial stack is ascending so the
    highest slots go first, and slots received from HOT go to the bottom (used last).
    """

    def __init__(self, capacity: int, slot_start: int = 0, name: str = "cold"):
        super().__init__(capacity, slot_start, name)
        self._stack = np.arange(slot_start, slot_start + capacity, dtype=SLOT_DTYPE)

    def low_free_run(self) -> int:
        """Free slots at the low end (next to the boundary)."""
        if not self.capacity:
            return 0
        i = int(np.argmin(self._is_free))
        return self.capacity if self._is_free[i] else i

    def give_low(self, n: int) -> None:
        """Hand the lowest ``n`` slots (all free) to HOT."""
        if n <= 0:
            return
        if n > self.low_free_run():
            raise ValueError(f"{self.name}: cannot give {n} low slots, only {self.low_free_run()} free there")
        free = self._stack[: self._top]
        free = free[free >= self.slot_start + n]
        self.slot_start += n
        self.capacity -= n
        self._is_free = self._is_free[n:].copy()
        self._stamp = self._stamp[n:].copy()
        self._stack = np.empty(self.capacity, SLOT_DTYPE)
        self._top = free.size
        self._stack[: self._top] = free

    def take_low(self, n: int) -> None:
        """Receive ``n`` free slots just below the low end (from HOT); they are used last."""
        if n <= 0:
            return
        new = np.arange(self.slot_start - n, self.slot_start, dtype=SLOT_DTYPE)
        stack = np.empty(self.capacity + n, SLOT_DTYPE)
        stack[:n] = new
        stack[n : n + self._top] = self._stack[: self._top]
        self._stack, self._top = stack, self._top + n
        self.slot_start -= n
        self.capacity += n
        self._is_free = np.concatenate([np.ones(n, bool), self._is_free])
        self._stamp = np.concatenate([np.zeros(n, np.int32), self._stamp])

    def prefer_high(self) -> None:
        """Re-sort the free stack so the highest free slots are handed out first (drains the low end)."""
        self._stack[: self._top] = np.sort(self._stack[: self._top])
