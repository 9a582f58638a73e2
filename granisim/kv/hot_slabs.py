"""The HOT side of the ``granikv`` allocator: slab placement, compaction, adaptive boundary.

:class:`HotSlabs` exists only for ``granikv`` (the ``token`` and ``paged`` policies have no
HOT pool and no ``HotSlabs``). :class:`granisim.kv.allocator.KVAllocator` builds it and
hands it what it works on:

* the HOT pool (it decides where slabs go; the pool itself only allocates runs),
* the radix index and the private store (read for what is cached and what COLD can spare),
* the :class:`granisim.kv.eviction.Eviction` part (it evicts HOT leaves through it),
* the shared counters (``hot_placements``, ``hot_fallbacks``),
* for ``hot_fraction = "adaptive"`` a :class:`granisim.kv.hot_demand.HotDemand`; with a
  fixed fraction there is none and the boundary never moves.

It owns the queue of KV copies that compaction produces (:meth:`HotSlabs.take_copies`
hands them to the executor) and the adaptive boundary's hysteresis. A slab belongs to
a live request (``_Seq.slab``) until :meth:`HotSlabs.cache_slab` gives it to a radix node
(``RadixNode.slab``); :func:`slab_splitter` keeps node and slab in step when the radix
index splits a HOT node.

HOT placement rule (``granikv``): a prefix goes to HOT when the workload *declares* it
shared (``shared_len`` at admission: the agent role's system prompt) and the part not
already cached needs a slab. When HOT has no free run long enough, the allocator
(1) compacts if total free space suffices, (2) else evicts unlocked HOT leaf slabs (HOT
nodes with no HOT node below them; their cached COLD descendants go with them) in LRU order
and compacts, (3) else falls back to COLD. Each outcome is
counted in stats (``hot_placements``, ``compactions``, ``hot_evictions``, ``hot_fallbacks``).

Adaptive HOT (``hot_fraction="adaptive"``): the HOT/COLD boundary moves online with
demand instead of sitting at a fixed share (mechanics: :mod:`granisim.kv.elastic`; the
boundary only ever moves across free slots). HOT starts empty. When an admission wants a
slab that HOT cannot place, HOT first grows into the free run at COLD's low end — never
taking what COLD needs for the request and the scheduler's reserve, plus a 2% headroom
(:meth:`HotSlabs.can_place`). :meth:`HotSlabs.rebalance` (the scheduler calls it before
each plan) shrinks HOT back towards the demand — the total length of the distinct shared
prefixes asked for in the last ``DEMAND_WINDOW`` admissions — evicting least-recently-used
unlocked slabs beyond it and handing HOT's free top run back to COLD.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from granisim.kv.counters import AllocatorCounters
from granisim.kv.eviction import Eviction
from granisim.kv.hot_demand import DEMAND_WINDOW, HotDemand
from granisim.kv.hot_pool import HotPool, KVCopy
from granisim.kv.radix import MatchResult, RadixIndex, RadixNode
from granisim.kv.sequence import _Seq

__all__ = ["DEMAND_WINDOW", "HOT_HEADROOM", "HotSlabs", "slab_splitter"]

HOT_HEADROOM = 0.02  # share of the budget COLD keeps free when HOT grows (adaptive HOT)


def slab_splitter(pool: HotPool) -> Callable[[RadixNode, RadixNode], None]:
    """The radix index's ``on_split`` for ``granikv``: a split HOT node splits its slab too."""

    def on_split(head: RadixNode, tail: RadixNode) -> None:
        if tail.pool == "hot":
            head.slab = tail.slab
            tail.slab = pool.split(tail.slab, len(head))

    return on_split


class HotSlabs:
    def __init__(self, pool: HotPool, radix: RadixIndex, store, eviction: Eviction, counters: AllocatorCounters,
                 *, budget: int, demand: HotDemand | None = None):
        self.pool = pool
        self.radix = radix
        self.store = store
        self.eviction = eviction
        self.counters = counters
        self.budget = budget  # the whole KV budget (HOT + COLD), for the headroom
        self.demand = demand  # None: the HOT/COLD boundary is fixed
        self.hysteresis = max(1, budget // 64)  # smallest boundary move worth making (adaptive HOT)
        self._copies: list[KVCopy] = []
        self._drained_at = -1  # admission count when COLD's free stack was last re-sorted

    # ---- placement ------------------------------------------------------------------------
    def wants_slab(self, shared_len: int, matched: int, prompt_len: int) -> bool:
        return (self.pool.capacity > 0 or self.demand is not None) and matched < shared_len <= prompt_len

    def can_place(self, n: int, cold_need: int, m: MatchResult) -> bool:
        """Whether a slab of ``n`` can be had, from free or evictable HOT; adaptive HOT first
        grows towards it (see :meth:`_grow`)."""
        if self.demand is not None:
            self._grow(n, cold_need, m)
        # the request's own matched HOT path is locked by admit: it is no room for the slab
        on_path = sum(len(x) for x in m.path() if x.lock_ref == 0 and x.pool == "hot")
        return self.pool.free + self.radix.evictable.get("hot", 0) - on_path >= n

    def place(self, seq: _Seq, n: int) -> None:
        """Reserve a slab of ``n`` for ``seq`` (counted as a placement), or count a fallback to COLD."""
        if self._make_room(n):
            seq.slab, seq.slab_len = self.pool.allocate(n), n
            self.counters.hot_placements += 1
        else:
            self.counters.hot_fallbacks += 1

    def _make_room(self, n: int) -> bool:
        hot = self.pool
        if n > hot.capacity:
            return False
        if hot.largest_free >= n:
            return True
        if hot.free + self.radix.evictable.get("hot", 0) < n:
            return False
        while hot.free < n:
            if not self.eviction.evict_lru_hot_leaf():
                return False
        if hot.largest_free < n:
            self.compact()
        return hot.largest_free >= n

    # ---- slab to cached prefix ------------------------------------------------------------
    def cache_slab(self, seq: _Seq, tokens: np.ndarray) -> RadixNode:
        """Insert ``tokens`` (``seq``'s cached path plus its filled slab) into the radix index,
        handing the slab to the new HOT node; returns the deepest node. The part of the slab
        that duplicates what was already cached goes back to the pool. The caller relocks
        ``seq`` on the node and clears its slab."""
        start, _ = self.pool.span(seq.slab)
        node, already = self.radix.insert(tokens, np.arange(start, start + seq.slab_len), "hot", below=seq.node)
        dup = already - seq.cached_len
        slab = seq.slab
        if dup >= seq.slab_len:
            self.pool.release(slab)
        else:
            if dup > 0:
                tail = self.pool.split(slab, dup)
                self.pool.release(slab)
                slab = tail
            node.slab = slab
        return node

    # ---- compaction -----------------------------------------------------------------------
    def compact(self) -> list[KVCopy]:
        """Compact the HOT pool now; the copies are also queued for the executor."""
        copies = self.pool.compact()
        for node in self.radix.nodes():
            if node.pool == "hot":
                start, length = self.pool.span(node.slab)
                node.value = np.arange(start, start + length, dtype=np.int64)
        self._copies.extend(copies)
        return copies

    def take_copies(self) -> list[KVCopy]:
        """KV copies queued since the last call (the executor applies them before the step)."""
        out, self._copies = self._copies, []
        return out

    # ---- adaptive HOT boundary ------------------------------------------------------------
    def note_demand(self, tokens: np.ndarray, shared_len: int, *, admitted: bool = False) -> None:
        """A request declaring a shared prefix was asked about (``admitted``: and admitted)."""
        if self.demand is not None:
            self.demand.note(tokens, shared_len)
            if admitted:
                self.demand.count_admission()

    def _grow(self, n: int, cold_need: int, m: MatchResult) -> None:
        """Grow HOT so that a slab of ``n`` fits, out of COLD's free low run, leaving COLD
        what the request (``cold_need`` tokens incl. the scheduler's reserve) and the headroom need."""
        hot, pool = self.pool, self.store.pool
        if hot.largest_free >= n:
            return
        on_path = sum(len(x) for x in m.path() if x.lock_ref == 0 and x.pool == self.store.name)
        spare = pool.free + self.radix.evictable.get(self.store.name, 0) - on_path - max(0, cold_need) \
            - int(HOT_HEADROOM * self.budget)
        want = n - hot.top_free_run()
        if want <= 0 or spare < want:
            return
        run = pool.low_free_run()
        if run < want and self._drained_at != self.demand.admissions:
            pool.prefer_high()  # let the low end drain as requests finish
            self._drained_at = self.demand.admissions
        if run >= want:
            pool.give_low(want)
            hot.grow_top(want)

    def give_back_free(self) -> None:
        """Adaptive HOT: hand all of HOT's free space back to COLD (compacting first), e.g. once the
        cache is cleared for a request that fits only an empty cache; HOT grows again on demand."""
        if self.demand is not None:
            self._shrink(self.pool.free, 1)

    def rebalance(self) -> None:
        """Adaptive HOT: shrink HOT towards the current prefix demand (no-op otherwise)."""
        if self.demand is None:
            return
        hot, target = self.pool, self.demand.total()
        if hot.capacity - target < self.hysteresis:
            return
        while hot.capacity - hot.free > target:  # stale slabs beyond the demand, LRU first
            if not self.eviction.evict_lru_hot_leaf():
                break
        self._shrink(min(hot.capacity - target, hot.free), self.hysteresis)

    def _shrink(self, give: int, least: int) -> None:
        """Hand up to ``give`` tokens of HOT's free top back to COLD, compacting first where that frees ``least``
        more; nothing unless at least ``least`` go."""
        hot = self.pool
        if hot.top_free_run() < give and give - hot.top_free_run() >= least:
            self.compact()
        give = min(give, hot.top_free_run())
        if give >= least:
            hot.shrink_top(give)
            self.store.pool.take_low(give)
