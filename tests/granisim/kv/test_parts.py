"""The allocator's parts through their own narrow interfaces, built by hand (no KVAllocator).

Each test was shown to fail on a planted bug (monkeypatched in, run, seen to fail, removed);
the bug is named in the test's docstring.
"""

import numpy as np
import pytest

from granisim.kv.allocator import build_pools
from granisim.kv.cold_pool import ColdPool
from granisim.kv.counters import AllocatorCounters
from granisim.kv.elastic import ElasticColdPool, ElasticHotPool
from granisim.kv.eviction import Eviction
from granisim.kv.hot_demand import HotDemand
from granisim.kv.hot_pool import HotPool
from granisim.kv.hot_slabs import HotSlabs, slab_splitter
from granisim.kv.layout import AllocatorStats
from granisim.kv.paged_pool import PagedPool
from granisim.kv.radix import RadixIndex
from granisim.kv.sequence import Requests, _Seq
from granisim.kv.stores import PageStore, TokenStore
from granisim.kv.views import prefix_group_of

HOT, COLD = 40, 60


def toks(*runs):
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


class Parts:
    """HOT pool [0, 40), COLD store [40, 100), radix index, counters, eviction, HOT slabs."""

    def __init__(self, demand=None):
        self.hot = HotPool(HOT, 0)
        self.store = TokenStore(ColdPool(COLD, HOT, name="cold"))
        self.radix = RadixIndex(1, on_split=slab_splitter(self.hot))
        self.counters = AllocatorCounters()
        self.eviction = Eviction(self.radix, self.store, self.hot, self.counters)
        self.slabs = HotSlabs(self.hot, self.radix, self.store, self.eviction, self.counters,
                              budget=HOT + COLD, demand=demand)

    def cache_hot(self, tokens):
        """Cache ``tokens`` beyond their cached prefix in a fresh HOT slab; returns the node."""
        m = self.radix.match_prefix(tokens)
        n = tokens.size - m.length
        slab = self.hot.allocate(n)
        s0, _ = self.hot.span(slab)
        slots = np.concatenate([n.value for n in m.path()] + [np.arange(s0, s0 + n)])
        node, _ = self.radix.insert(tokens, slots, "hot")
        node.slab = slab
        return node

    def cache_cold(self, tokens):
        m = self.radix.match_prefix(tokens)
        fresh = self.store.reserve(0, tokens.size - m.length)
        node, _ = self.radix.insert(tokens, np.concatenate([n.value for n in m.path()] + [fresh]), "cold")
        return node


def test_lru_hot_leaf_skips_nodes_with_a_hot_child_and_takes_cold_descendants():
    """Planted bugs caught: candidates not filtered by 'has a HOT descendant' (A would go
    first, taking C with it); max instead of min of the LRU key (B would go first)."""
    p = Parts()
    a = p.cache_hot(toks((1, 11)))  # oldest, but C below it is HOT
    c = p.cache_hot(toks((1, 16)))
    b = p.cache_hot(toks((20, 30)))
    p.cache_cold(toks((20, 33)))  # a cached COLD child of B
    assert p.store.free == COLD - 3
    order = []
    for _ in range(3):
        alive = {x.id for x in p.radix.nodes()}
        assert p.eviction.evict_lru_hot_leaf()
        order.append({a.id, b.id, c.id} & alive - {x.id for x in p.radix.nodes()})
    assert order == [{c.id}, {a.id}, {b.id}]
    assert not p.eviction.evict_lru_hot_leaf()
    assert p.hot.free == HOT and p.store.free == COLD
    assert (p.counters.hot_evictions, p.counters.evictions, p.counters.evicted_tokens) == (3, 4, 28)


def test_lru_hot_leaf_never_takes_a_locked_node():
    """Planted bug caught: candidates not filtered by lock_ref (the locked slab is freed)."""
    p = Parts()
    node = p.cache_hot(toks((1, 11)))
    p.radix.lock(node)
    assert not p.eviction.evict_lru_hot_leaf()
    assert p.hot.free == HOT - 10 and p.counters.hot_evictions == 0


def test_compaction_moves_node_values_with_their_slabs_and_queues_copies_once():
    """Planted bugs caught: node values not rewritten after compaction (they point at the
    old positions); take_copies that does not empty the queue."""
    p = Parts()
    first = p.cache_hot(toks((1, 11)))
    second = p.cache_hot(toks((20, 30)))
    p.radix.evict(10, "hot", p.eviction.free_node)  # the older slab goes: a hole at [0, 10)
    assert (p.hot.free, p.hot.largest_free) == (30, 20) and second.value[0] == 10
    copies = p.slabs.compact()
    assert [(c.src, c.dst, c.length) for c in copies] == [(10, 0, 10)]
    assert np.array_equal(second.value, np.arange(0, 10)) and p.hot.span(second.slab) == (0, 10)
    assert p.slabs.take_copies() == copies and p.slabs.take_copies() == []
    assert first.id not in {x.id for x in p.radix.nodes()}


def test_place_evicts_and_compacts_to_fit_and_counts_each_outcome():
    """Planted bug caught: place() that counts a placement without reserving the slab
    (seq.slab stays None), and one that never compacts after evicting."""
    p = Parts()
    keep = p.cache_hot(toks((1, 11)))  # [0, 10), locked
    p.radix.lock(keep)
    p.cache_hot(toks((20, 30)))  # [10, 20), cached: the one victim
    locked = p.cache_hot(toks((40, 55)))  # [20, 35), locked; [35, 40) free
    p.radix.lock(locked)
    seq = _Seq(0, p.radix.root, 0, 12)
    p.slabs.place(seq, 12)  # evicting the victim frees 15 in two runs (10 + 5): compaction joins them
    assert seq.slab is not None and seq.slab_len == 12 and p.hot.span(seq.slab) == (25, 12)
    assert (p.counters.hot_placements, p.counters.hot_evictions, p.counters.hot_fallbacks) == (1, 1, 0)
    assert p.hot.compactions == 1 and np.array_equal(locked.value, np.arange(10, 25))
    other = _Seq(1, p.radix.root, 0, 5)
    p.slabs.place(other, 5)  # 3 slots left, all else locked or reserved
    assert other.slab is None and p.counters.hot_fallbacks == 1


def test_cache_slab_returns_the_already_cached_head_to_the_pool():
    """Planted bug caught: a slab whose head duplicates cached tokens handed whole to the
    node (the node's slab and value disagree, and the head's slots leak)."""
    p = Parts()
    prompt = toks((1, 11))
    seq = _Seq(0, p.radix.root, 0, 10)  # admitted while nothing was cached
    p.slabs.place(seq, 10)
    seq.n_new = 10
    p.cache_cold(prompt[:4])  # meanwhile another request cached the first 4 tokens
    node = p.slabs.cache_slab(seq, prompt)
    assert len(node) == 6 and node.pool == "hot"
    s0, ln = p.hot.span(node.slab)
    assert ln == 6 and np.array_equal(node.value, np.arange(s0, s0 + 6))
    assert p.hot.free == HOT - 6


def test_split_hot_node_splits_its_slab_in_step():
    """Planted bug caught: the splitter giving the head the tail's new slab id (head and
    tail spans swapped against their values)."""
    p = Parts()
    node = p.cache_hot(toks((1, 11)))
    p.radix.match_prefix(np.array([1, 2, 3, 4, 99], np.int64))  # partial match: split after 4
    heads = sorted((x for x in p.radix.nodes() if x.pool == "hot"), key=len)
    assert [len(x) for x in heads] == [4, 6] and heads[1] is node
    for x in heads:
        s0, ln = p.hot.span(x.slab)
        assert ln == len(x) and np.array_equal(x.value, np.arange(s0, s0 + ln))


def test_hot_demand_window_keeps_prefixes_asked_within_it():
    """Planted bug caught: an off-by-one horizon (``t <= horizon``) that drops a prefix
    asked exactly ``window`` admissions ago."""
    d = HotDemand(window=2)
    a, b = toks((1, 6)), toks((10, 13))
    d.note(a, 5)
    d.count_admission()
    d.note(b, 3)
    d.count_admission()
    assert d.total() == 8  # A asked at admission 0, two admissions ago: still in the window
    d.count_admission()
    assert d.total() == 3
    d.note(a, 5)  # asked again: back in
    assert d.total() == 8


def test_hot_slabs_count_demand_only_when_adaptive():
    """Planted bug caught: note_demand counting an admission without ``admitted``."""
    fixed, adaptive = Parts(), Parts(demand=HotDemand(4))
    for p in (fixed, adaptive):
        p.slabs.note_demand(toks((1, 9)), 8)
        p.slabs.note_demand(toks((1, 9)), 8, admitted=True)
    assert fixed.slabs.demand is None
    assert adaptive.slabs.demand.admissions == 1 and adaptive.slabs.demand.total() == 8


def test_requests_table():
    """Planted bug caught: remove() that leaves the record behind."""
    reqs = Requests()
    root = RadixIndex().root
    for rid in (7, 3, 5):
        reqs.add(_Seq(rid, root, 0, 0))
    assert reqs.ids() == [7, 3, 5] and [q.rid for q in reqs] == [7, 3, 5] and 3 in reqs
    with pytest.raises(ValueError, match="already admitted"):
        reqs.add(_Seq(3, root, 0, 0))
    reqs.remove(3)
    assert 3 not in reqs and len(reqs) == 2
    with pytest.raises(ValueError, match="unknown request id 3"):
        reqs.get(3)


def test_prefix_group_needs_the_shared_prefix_to_end_at_a_node():
    """Planted bug caught: the node-boundary check dropped (a group whose shared prefix
    ends inside a node, so the group's node holds more than the shared tokens)."""
    p = Parts()
    node = p.cache_hot(toks((1, 11)))
    cold = p.cache_cold(toks((1, 15)))
    assert prefix_group_of(_Seq(0, cold, 14, 10), 1) == (node.id, 10, "slab")
    assert prefix_group_of(_Seq(0, cold, 14, 8), 1) is None
    assert prefix_group_of(_Seq(0, cold, 14, 14), 1) == (cold.id, 14, "cold")
    assert prefix_group_of(_Seq(0, node, 10, 12), 1) is None  # not cached that far yet


def test_build_pools_places_hot_below_cold():
    """Planted bug caught: COLD starting at 0 (overlapping HOT) or sized by the whole budget."""
    hot, store = build_pools("granikv", 100, 0.25, 16)
    assert (hot.slot_start, hot.capacity, store.pool.slot_start, store.capacity) == (0, 25, 25, 75)
    hot, store = build_pools("granikv", 100, "adaptive", 16)
    assert isinstance(hot, ElasticHotPool) and isinstance(store.pool, ElasticColdPool)
    assert (hot.capacity, store.capacity) == (0, 100)
    hot, store = build_pools("token", 100, 0.25, 16)
    assert hot is None and store.name == "token" and store.capacity == 100
    hot, store = build_pools("paged", 100, 0.25, 16)
    assert hot is None and isinstance(store, PageStore) and isinstance(store.pool, PagedPool)
    assert store.capacity == 96


def test_counters_fill_every_counter_field_of_the_stats():
    """Planted bug caught: a counter missing from as_dict() (AllocatorStats cannot be built)."""
    c = AllocatorCounters(*range(1, 9))
    stats = AllocatorStats(policy="token", pools={}, compactions=0, copied_tokens=0, **c.as_dict())
    assert [getattr(stats, k) for k in c.as_dict()] == list(range(1, 9))
