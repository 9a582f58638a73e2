"""The HOT side of the ``granikv`` allocator: slab placement, compaction, adaptive boundary.

A mixin of :class:`granisim.kv.allocator.KVAllocator`, separate because only ``granikv``
has a HOT pool: the ``token`` and ``paged`` policies never reach this code. It works on
the host's state (``hot``, ``store``, ``radix``, ``capacity``, ``adaptive``, ``_n``,
``_slab_owner``, ``_copies`` and the demand fields set in ``KVAllocator.__init__``) and
calls back into it (``_free_node``, ``_relock``, ``_path_slots``).

HOT placement rule (``granikv``): a prefix goes to HOT when the workload *declares* it
shared (``shared_len`` at admission: the agent role's system prompt) and the part not
already cached needs a slab. When HOT has no free run long enough, the allocator
(1) compacts if total free space suffices, (2) else evicts unlocked HOT leaf slabs (HOT
nodes with no HOT node below them; their cached COLD descendants go with them) in LRU order
and compacts, (3) else falls back to COLD. Each outcome is
counted in stats (``hot_placements``, ``compactions``, ``hot_evictions``, ``hot_fallbacks``).
Compaction's KV copies are queued for the executor (:meth:`take_copies`).

Adaptive HOT (``hot_fraction="adaptive"``): the HOT/COLD boundary moves online with
demand instead of sitting at a fixed share (mechanics: :mod:`granisim.kv.elastic`; the
boundary only ever moves across free slots). HOT starts empty. When an admission wants a
slab that HOT cannot place, HOT first grows into the free run at COLD's low end — never
taking what COLD needs for the request and the scheduler's reserve, plus a 2% headroom.
:meth:`rebalance` (the scheduler calls it before each plan) shrinks HOT back towards the
demand — the total length of the distinct shared prefixes asked for in the last
``DEMAND_WINDOW`` admissions — evicting least-recently-used unlocked slabs beyond it and
handing HOT's free top run back to COLD.
"""

from __future__ import annotations

import numpy as np

from granisim.kv.hot_pool import KVCopy
from granisim.kv.radix import RadixNode
from granisim.kv.sequence import _Seq

DEMAND_WINDOW = 256  # admissions over which a shared prefix counts as in demand (adaptive HOT)
HOT_HEADROOM = 0.02  # share of the budget COLD keeps free when HOT grows (adaptive HOT)


class HotSlabs:
    """KVAllocator's HOT-pool methods (mixin)."""

    # ---- placement ------------------------------------------------------------------------
    def _wants_slab(self, shared_len: int, matched: int, prompt_len: int) -> bool:
        return self.hot is not None and (self.hot.capacity > 0 or self.adaptive) and matched < shared_len <= prompt_len

    # ---- adaptive HOT boundary ------------------------------------------------------------
    def _note_demand(self, tokens: np.ndarray, shared_len: int) -> None:
        self._demand[hash(tokens[:shared_len].tobytes())] = (shared_len, self._admissions)

    def hot_demand(self) -> int:
        """Tokens of the distinct shared prefixes asked for in the last DEMAND_WINDOW admissions."""
        horizon = self._admissions - self._demand_window
        stale = [k for k, (_, t) in self._demand.items() if t < horizon]
        for k in stale:
            del self._demand[k]
        return sum(n for n, _ in self._demand.values())

    def _grow_hot(self, n: int, cold_need: int, m) -> None:
        """Grow HOT so that a slab of ``n`` fits, out of COLD's free low run, leaving COLD
        what the request (``cold_need`` tokens incl. the scheduler's reserve) and the headroom need."""
        hot, pool = self.hot, self.store.pool
        if hot.largest_free >= n:
            return
        on_path = sum(len(x) for x in m.path() if x.lock_ref == 0 and x.pool == self.store.name)
        spare = pool.free + self.radix.evictable.get(self.store.name, 0) - on_path - max(0, cold_need) \
            - int(HOT_HEADROOM * self.capacity)
        want = n - hot.top_free_run()
        if want <= 0 or spare < want:
            return
        run = pool.low_free_run()
        if run < want and self._drained_at != self._admissions:
            pool.prefer_high()  # let the low end drain as requests finish
            self._drained_at = self._admissions
        if run >= want:
            pool.give_low(want)
            hot.grow_top(want)

    def rebalance(self) -> None:
        """Adaptive HOT: shrink HOT towards the current prefix demand (no-op otherwise)."""
        if not self.adaptive:
            return
        hot, target = self.hot, self.hot_demand()
        if hot.capacity - target < self._hyst:
            return
        while hot.capacity - hot.free > target:  # stale slabs beyond the demand, LRU first
            victims = self._hot_leaves()
            if not victims:
                break
            self.radix.evict_subtree(min(victims, key=lambda x: (x.last_access, x.id)), self._free_node)
            self._n["hot_evictions"] += 1
        give = min(hot.capacity - target, hot.free)
        if hot.top_free_run() < give and give - hot.top_free_run() >= self._hyst:
            self.compact()
        give = min(give, hot.top_free_run())
        if give >= self._hyst:
            hot.shrink_top(give)
            self.store.pool.take_low(give)

    # ---- slab to cached prefix ------------------------------------------------------------
    def _cache_slab(self, seq: _Seq, tokens: np.ndarray) -> None:
        start, _ = self.hot.span(seq.slab)
        slots = np.concatenate([self._path_slots(seq.node), np.arange(start, start + seq.slab_len)])
        node, already = self.radix.insert(tokens, slots, "hot")
        dup = already - seq.cached_len
        slab = seq.slab
        del self._slab_owner[slab]
        if dup >= seq.slab_len:
            self.hot.release(slab)
        else:
            if dup > 0:
                tail = self.hot.split(slab, dup)
                self.hot.release(slab)
                slab = tail
            node.slab = slab
            self._slab_owner[slab] = node
        self._relock(seq, node, tokens.size)
        seq.n_new -= seq.slab_len
        seq.slab, seq.slab_len = None, 0

    # ---- room, compaction, radix splits ---------------------------------------------------
    def _make_hot_room(self, n: int) -> bool:
        hot = self.hot
        if n > hot.capacity:
            return False
        if hot.largest_free >= n:
            return True
        if hot.free + self.radix.evictable.get("hot", 0) < n:
            return False
        while hot.free < n:
            victims = self._hot_leaves()
            if not victims:
                return False
            victim = min(victims, key=lambda x: (x.last_access, x.id))
            self.radix.evict_subtree(victim, self._free_node)
            self._n["hot_evictions"] += 1
        if hot.largest_free < n:
            self.compact()
        return hot.largest_free >= n

    def _hot_leaves(self) -> list[RadixNode]:
        """Unlocked HOT nodes with no HOT node below them (LRU candidates: evicting one frees
        its slab and only its cold descendants, never a more recent HOT child's slab)."""
        hot_nodes = [x for x in self.radix.nodes() if x.pool == "hot"]
        above: set[int] = set()  # ids of nodes that have a HOT descendant
        for x in hot_nodes:
            p = x.parent
            while p is not None and p.id not in above:
                above.add(p.id)
                p = p.parent
        return [x for x in hot_nodes if x.lock_ref == 0 and x.id not in above]

    def compact(self) -> list[KVCopy]:
        """Compact the HOT pool now; the copies are also queued for the executor."""
        if self.hot is None:
            return []
        copies = self.hot.compact()
        for slab, owner in self._slab_owner.items():
            if isinstance(owner, RadixNode):
                start, length = self.hot.span(slab)
                owner.value = np.arange(start, start + length, dtype=np.int64)
        self._copies.extend(copies)
        return copies

    def take_copies(self) -> list[KVCopy]:
        """KV copies queued since the last call (the executor applies them before the step)."""
        out, self._copies = self._copies, []
        return out

    def _on_split(self, head: RadixNode, tail: RadixNode) -> None:
        if tail.pool == "hot":
            head.slab = tail.slab
            tail.slab = self.hot.split(tail.slab, len(head))
            self._slab_owner[head.slab] = head
            self._slab_owner[tail.slab] = tail
