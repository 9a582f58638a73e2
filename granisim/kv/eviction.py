"""Eviction for :class:`granisim.kv.allocator.KVAllocator`: freeing cached radix nodes under memory pressure.

A mixin, separate because it never admits or grows a request: it frees what the radix index
holds unlocked (LRU), from the HOT slabs or the private store. It reads the host's ``radix``,
``hot``, ``store``, ``_slab_owner`` and ``_n``.
"""

from __future__ import annotations

from granisim.kv.radix import RadixNode


class Eviction:
    """KVAllocator's eviction methods (mixin)."""

    def _free_node(self, node: RadixNode) -> None:
        if node.pool == "hot":
            del self._slab_owner[node.slab]
            self.hot.release(node.slab)
        else:
            self.store.release(node.value)
        self._n["evictions"] += 1
        self._n["evicted_tokens"] += len(node)

    def _evict(self, pool: str, n: int) -> int:
        return self.radix.evict(n, pool, self._free_node)

    def evict(self, n: int) -> int:
        """Evict up to ``n`` cached private-pool tokens (LRU); returns tokens freed."""
        return self._evict(self.store.name, n)

    def clear_cache(self) -> int:
        """Evict every unlocked cached node in every pool; returns tokens freed."""
        freed = 0
        for node in list(self.radix.root.children.values()):
            freed += self._evict_unlocked(node)
        return freed

    def _evict_unlocked(self, node: RadixNode) -> int:
        if node.lock_ref == 0:
            return self.radix.evict_subtree(node, self._free_node)
        return sum(self._evict_unlocked(c) for c in list(node.children.values()))
