"""Property-based fuzzing of an allocator policy with hypothesis stateful testing.

``allocator_machine(factory)`` builds a ``RuleBasedStateMachine`` for any object with the
:class:`granisim.kv.KVAllocator` interface, so users can point it at their own policy.
A shadow array records the token id last written into every slot (KV writes and the
allocator's compaction copies are replayed on it), so any layout or radix node that maps
to the wrong slots shows up as a token mismatch.

Invariants checked after every rule:
  * no slot is owned twice, and no owned slot is free;
  * per pool: free + used + cached == capacity, and owned slots == used + cached;
  * every HOT node's slots are one contiguous run equal to its slab;
  * reference counts are never negative and every locked node is still in the tree;
  * every live request's layout, and every radix node, maps to exactly its own tokens;
  * at teardown, after releasing everything and evicting all, every pool is full again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from granisim.kv.allocator import KVAllocator, make_allocator
from granisim.kv.radix import RadixNode

VOCAB = 6  # tiny vocabulary: many partial matches, hence many node splits
AGENT_PROMPTS = [np.array(p, dtype=np.int64) for p in ([1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2],
                                                      [1, 2, 3, 0, 0, 0, 4, 4, 4, 4, 1, 2],
                                                      [5, 4, 3, 2, 1, 0, 5, 4, 3, 2, 1, 0, 5, 4, 3, 2, 1, 0])]
FUZZ_CAPACITY = 160


def default_factory(policy: str) -> Callable[[], KVAllocator]:
    if policy == "granikv-adaptive":  # HOT/COLD boundary that moves with demand
        # a short demand window so that HOT also shrinks within one example
        return lambda: make_allocator("granikv", FUZZ_CAPACITY, hot_fraction="adaptive", demand_window=1)
    page = 4 if policy.startswith("paged") else None
    return lambda: make_allocator(policy if policy != "paged" else "paged", FUZZ_CAPACITY, hot_fraction=0.25,
                                  page_size=page)


def allocator_machine(factory: Callable[[], KVAllocator]) -> type[RuleBasedStateMachine]:
    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.alloc = factory()
            self.shadow = np.full(self.alloc.capacity, -1, dtype=np.int64)
            self.reqs: dict[int, dict] = {}  # rid -> {tokens, done, shared}
            self.history: list[np.ndarray] = []
            self.ext_locks: list[RadixNode] = []
            self.next_rid = 0

        # ---- helpers ---------------------------------------------------------------------
        def _sync_copies(self):
            for c in self.alloc.take_copies():
                self.shadow[c.dst : c.dst + c.length] = self.shadow[c.src : c.src + c.length].copy()

        def _write(self, rid: int, n: int) -> bool:
            r = self.reqs[rid]
            if not self.alloc.can_extend({rid: n}):
                return False
            slots = self.alloc.extend(rid, n)
            assert slots.size == n, f"extend({rid}, {n}) returned {slots.size} slots"
            self._sync_copies()
            self.shadow[slots] = r["tokens"][r["done"] : r["done"] + n]
            r["done"] += n
            return True

        # ---- rules -----------------------------------------------------------------------
        @rule(agent=st.integers(-1, len(AGENT_PROMPTS) - 1), reuse=st.integers(0, 30),
              suffix=st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=12),
              outputs=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
              chunk=st.integers(1, 40))
        def arrive(self, agent, reuse, suffix, outputs, chunk):
            if agent >= 0:
                prefix, shared = AGENT_PROMPTS[agent], len(AGENT_PROMPTS[agent])
            elif self.history:
                prev = self.history[reuse % len(self.history)]
                prefix, shared = prev[: 1 + reuse % len(prev)], 0
            else:
                prefix, shared = np.empty(0, np.int64), 0
            prompt = np.concatenate([prefix, np.array(suffix, np.int64)])
            if prompt.size == 0:
                prompt = np.array([0], np.int64)
            if not self.alloc.can_admit(prompt, shared, 0):
                return
            rid = self.next_rid
            self.next_rid += 1
            cached = self.alloc.admit(rid, prompt, shared)
            self._sync_copies()
            assert 0 <= cached < prompt.size
            tokens = np.concatenate([prompt, np.array(outputs, np.int64)])
            self.reqs[rid] = dict(tokens=tokens, done=cached, shared=shared, prompt=prompt.size)
            self.history.append(prompt)
            # prefill in chunks; a request that cannot grow is preempted (nothing lost here)
            while self.reqs[rid]["done"] < prompt.size:
                n = min(chunk, prompt.size - self.reqs[rid]["done"])
                if not self._write(rid, n):
                    self.alloc.release(rid)
                    del self.reqs[rid]
                    return
                if shared and self.reqs[rid]["done"] >= shared:
                    self.alloc.cache_prefix(rid, tokens[:shared])
                    self._sync_copies()

        @precondition(lambda self: self.reqs)
        @rule(pick=st.integers(0, 10**6))
        def decode(self, pick):
            rid = sorted(self.reqs)[pick % len(self.reqs)]
            r = self.reqs[rid]
            if r["done"] < r["tokens"].size:
                self._write(rid, 1)

        @precondition(lambda self: self.reqs)
        @rule(pick=st.integers(0, 10**6), cache=st.booleans())
        def finish(self, pick, cache):
            rid = sorted(self.reqs)[pick % len(self.reqs)]
            r = self.reqs.pop(rid)
            self.alloc.release(rid, r["tokens"][: r["done"]] if cache else None)
            self._sync_copies()

        @rule(pick=st.integers(0, 10**6), length=st.integers(1, 40))
        def match(self, pick, length):
            if not self.history:
                return
            q = self.history[pick % len(self.history)][:length]
            m = self.alloc.radix.match_prefix(q)
            slots = np.concatenate([n.value for n in m.path()]) if m.length else np.empty(0, np.int64)
            assert slots.size == m.length
            assert np.array_equal(self.shadow[slots], q[: m.length]), "matched slots hold other tokens"

        @rule(pick=st.integers(0, 10**6))
        def lock(self, pick):
            nodes = sorted(self.alloc.radix.nodes(), key=lambda n: n.id)
            if nodes:
                node = nodes[pick % len(nodes)]
                self.alloc.radix.lock(node)
                self.ext_locks.append(node)

        @precondition(lambda self: self.ext_locks)
        @rule(pick=st.integers(0, 10**6))
        def unlock(self, pick):
            node = self.ext_locks.pop(pick % len(self.ext_locks))
            self.alloc.radix.unlock(node)

        @rule(n=st.integers(1, 200))
        def evict(self, n):
            self.alloc.evict(n)
            self._sync_copies()

        @rule()
        def flush(self):
            self.alloc.clear_cache()
            self._sync_copies()

        @rule()
        def rebalance(self):  # adaptive HOT moves its boundary (a no-op for the other policies)
            if hasattr(self.alloc, "rebalance"):
                self.alloc.rebalance()
                self._sync_copies()

        @rule()
        def compact(self):
            self.alloc.compact()
            self._sync_copies()

        # ---- invariants ------------------------------------------------------------------
        @invariant()
        def slots_owned_once_and_conserved(self):
            owned = self.alloc.ownership()
            allslots = np.concatenate([o[3] for o in owned]) if owned else np.empty(0, np.int64)
            uniq, counts = np.unique(allslots, return_counts=True)
            assert (counts == 1).all(), f"slot {int(uniq[counts > 1][0])} owned twice"
            stats = self.alloc.stats()
            for name, pool in self.alloc.pools().items():
                ps = stats.pools[name]
                assert ps.free + ps.used + ps.cached == ps.capacity, f"{name}: free+used+cached != capacity"
                assert min(ps.free, ps.used, ps.cached) >= 0, f"{name}: negative count {ps}"
                lo = pool.slot_start if name == "hot" else _store_start(pool)
                mine = [o[3] for o in owned if o[2] == name]
                n_owned = int(sum(m.size for m in mine))
                assert n_owned == ps.used + ps.cached, f"{name}: {n_owned} owned slots but used+cached={ps.used + ps.cached}"
                free_mask = _free_mask(pool)
                if mine and free_mask is not None:
                    s = np.concatenate(mine) - lo
                    assert not free_mask[s].any(), f"{name}: a slot is both owned and free"

        @invariant()
        def hot_nodes_are_slabs(self):
            for node in self.alloc.radix.nodes():
                if node.pool == "hot":
                    start, length = self.alloc.hot.span(node.slab)
                    assert length == len(node) and np.array_equal(node.value, np.arange(start, start + length)), \
                        f"hot node {node.id} is not its contiguous slab"

        @invariant()
        def refcounts_and_locks(self):
            nodes = self.alloc.radix.nodes()
            for node in nodes:
                assert node.lock_ref >= 0, f"node {node.id} has negative references"
            walked = {n.id for n in nodes if not n.children and n.lock_ref == 0}
            assert {n.id for n in self.alloc.radix.evictable_leaves()} == walked, "evictable leaf index is stale"
            for node in self.ext_locks:
                n = node
                while n.parent is not None:
                    n = n.parent
                assert n is self.alloc.radix.root, f"locked node {node.id} was evicted"

        @invariant()
        def layouts_hold_own_tokens(self):
            for rid, r in self.reqs.items():
                lay = self.alloc.layout(rid)
                slots = lay.slots()
                assert lay.num_tokens == r["done"] == slots.size, f"request {rid}: layout length"
                assert np.array_equal(self.shadow[slots], r["tokens"][: r["done"]]), \
                    f"request {rid}: layout maps to other tokens"
            for node in self.alloc.radix.nodes():
                assert np.array_equal(self.shadow[node.value], node.key), f"node {node.id} maps to other tokens"

        def teardown(self):
            for rid in list(self.reqs):
                self.alloc.release(rid)
            for node in self.ext_locks:
                self.alloc.radix.unlock(node)
            self.alloc.clear_cache()
            for name, ps in self.alloc.stats().pools.items():
                assert ps.free == ps.capacity, f"{name}: {ps.capacity - ps.free} slots not returned after releasing all"

    AllocatorMachine.__name__ = "AllocatorMachine"
    return AllocatorMachine


def _store_start(store) -> int:
    return store.pool.slot_start


def _free_mask(pool) -> np.ndarray | None:
    inner = getattr(pool, "pool", None)
    if inner is None:  # HotPool
        mask = np.zeros(pool.capacity, bool)
        for start, length in pool.free_ranges():
            mask[start - pool.slot_start : start - pool.slot_start + length] = True
        return mask
    if hasattr(inner, "free_mask"):  # ColdPool
        return inner.free_mask()
    pages = inner._pages.free_mask()  # PagedPool: expand page flags to slots
    return np.repeat(pages, inner.page_size)


def fuzz_settings(examples: int, steps: int = 30) -> hsettings:
    return hsettings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                     suppress_health_check=list(__import__("hypothesis").HealthCheck))
