"""Eviction: freeing cached (unlocked) radix nodes under memory pressure, LRU first.

Owned by :class:`granisim.kv.allocator.KVAllocator`, which builds it from the radix index,
the private store, the HOT pool (``granikv`` only) and the shared counters. It owns no
state of its own: a node's storage goes back to the HOT pool (the node's slab) or to the
store (its slots), and ``evictions`` / ``evicted_tokens`` / ``hot_evictions`` are counted.
The allocator calls :meth:`Eviction.evict` when a private pool runs short and
:meth:`Eviction.clear_cache`; :class:`granisim.kv.hot_slabs.HotSlabs` calls
:meth:`Eviction.evict_lru_hot_leaf` to make room in HOT or to shrink it.
"""

from __future__ import annotations

from granisim.kv.counters import AllocatorCounters
from granisim.kv.hot_pool import HotPool
from granisim.kv.radix import RadixIndex, RadixNode


class Eviction:
    def __init__(self, radix: RadixIndex, store, hot: HotPool | None, counters: AllocatorCounters, host=None):
        self.radix = radix
        self.host = host  # granisim.kv.host_tier.HostTier or None (evicted KV is dropped)
        self.store = store
        self.hot = hot
        self.counters = counters

    def free_node(self, node: RadixNode) -> None:
        """Give an evicted node's storage back (the radix index has already dropped it)."""
        if self.host is not None:
            self.host.write_back(node)  # its slots are still intact: copy what the host lacks
        if node.pool == "hot":
            self.hot.release(node.slab)
        else:
            self.store.release(node.value)
        self.counters.evictions += 1
        self.counters.evicted_tokens += len(node)

    def evict(self, pool: str, n: int) -> int:
        """Evict up to ``n`` cached tokens of ``pool`` (LRU, :meth:`RadixIndex.evict`); returns tokens freed."""
        return self.radix.evict(n, pool, self.free_node)

    def evict_lru_hot_leaf(self) -> bool:
        """Evict the least recently used unlocked HOT leaf with its cached descendants;
        False when there is none."""
        victims = self._hot_leaves()
        if not victims:
            return False
        self.radix.evict_subtree(min(victims, key=lambda x: (x.last_access, x.id)), self.free_node)
        self.counters.hot_evictions += 1
        return True

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

    def clear_cache(self) -> int:
        """Evict every unlocked cached node in every pool; returns tokens freed."""
        freed = 0
        for node in list(self.radix.root.children.values()):
            freed += self._evict_unlocked(node)
        return freed

    def _evict_unlocked(self, node: RadixNode) -> int:
        if node.lock_ref == 0:
            return self.radix.evict_subtree(node, self.free_node)
        return sum(self._evict_unlocked(c) for c in list(node.children.values()))
