"""The movable HOT/COLD boundary: pools hand free slots across it and nothing else."""

import numpy as np
import pytest

from granisim.kv.allocator import make_allocator
from granisim.kv.elastic import ElasticColdPool, ElasticHotPool


def test_cold_hands_out_high_slots_first_and_gives_its_low_run():
    cold = ElasticColdPool(10, 0)
    a = cold.allocate(3)
    assert sorted(a.tolist()) == [7, 8, 9] and cold.low_free_run() == 7
    cold.give_low(4)
    assert (cold.slot_start, cold.capacity, cold.free) == (4, 6, 3)
    assert sorted(cold.allocate(3).tolist()) == [4, 5, 6]
    with pytest.raises(ValueError):
        cold.give_low(1)  # slot 4 is in use
    cold.free_slots(np.array([5]))
    cold.take_low(2)  # slots 2, 3 come back; used last
    assert (cold.slot_start, cold.capacity, cold.free) == (2, 8, 3)
    assert cold.allocate(1).tolist() == [5]
    assert sorted(cold.allocate(2).tolist()) == [2, 3]
    assert cold.free_mask().sum() == cold.free == 0


def test_prefer_high_drains_the_low_end():
    cold = ElasticColdPool(8, 0)
    s = cold.allocate(8)
    cold.free_slots(s[::-1])  # low slots now on top of the stack
    cold.prefer_high()
    assert sorted(cold.allocate(3).tolist()) == [5, 6, 7]
    assert cold.low_free_run() == 5


def test_hot_top_run_grows_and_shrinks():
    hot = ElasticHotPool(0, 0)
    hot.grow_top(6)
    a = hot.allocate(4)
    assert hot.span(a) == (0, 4) and hot.top_free_run() == 2
    hot.shrink_top(2)
    assert hot.capacity == 4 and hot.free == 0 and hot.top_free_run() == 0
    with pytest.raises(ValueError):
        hot.shrink_top(1)
    hot.grow_top(3)
    assert hot.free_ranges() == [(4, 3)]


def test_adaptive_allocator_grows_for_demand_and_shrinks_back():
    alloc = make_allocator("granikv", 1000, hot_fraction="adaptive", demand_window=2)
    assert alloc.hot.capacity == 0
    prefix = np.arange(100, dtype=np.int64)
    for rid in range(2):
        prompt = np.concatenate([prefix, np.array([500 + rid], np.int64)])
        assert alloc.can_admit(prompt, 100, 0)
        cached = alloc.admit(rid, prompt, 100)
        alloc.extend(rid, prompt.size - cached)
        if rid == 0:
            alloc.cache_prefix(rid, prefix)
    assert alloc.hot.capacity == 100 and alloc.stats().hot_placements == 1
    assert alloc.prefix_group(1)[2] == "slab"
    for rid in range(2):
        alloc.release(rid)
    # the demand moves to other prefixes: the old slab is stale and HOT gives its room back
    for rid, base in ((2, 1000), (3, 2000)):
        prompt = np.arange(base, base + 20, dtype=np.int64)
        assert alloc.can_admit(prompt, 10, 0)
        alloc.admit(rid, prompt, 10)
        alloc.release(rid)
    alloc.rebalance()
    assert alloc.hot.capacity <= alloc.hot_demand() + alloc.hot_slabs.hysteresis
    assert alloc.hot.capacity + alloc.store.capacity == 1000
    assert alloc.store.pool.slot_start == alloc.hot.capacity
