"""COLD pool: token-granular free list with vectorised bulk allocate/free."""

import numpy as np
import pytest

from granisim.kv import ColdPool


def snapshot(pool: ColdPool):
    return pool.free, pool.used, pool.free_mask().tobytes()


def test_starts_full_with_its_own_slot_range():
    pool = ColdPool(10, slot_start=100)
    assert (pool.capacity, pool.free, pool.used) == (10, 10, 0)
    s = pool.allocate(10)
    assert sorted(s.tolist()) == list(range(100, 110))
    assert pool.owns(s) and not pool.owns(np.array([99])) and not pool.owns(np.array([110]))


def test_bulk_allocate_free_round_trip():
    pool = ColdPool(1000)
    a = pool.allocate(256)
    b = pool.allocate(300)
    assert a.size == 256 and b.size == 300
    assert np.unique(np.concatenate([a, b])).size == 556  # no slot handed out twice
    assert pool.free == 444 and pool.used == 556
    assert not pool.free_mask()[a].any()
    pool.free_slots(a)
    assert pool.free == 700 and pool.free_mask()[a].all()
    pool.free_slots(b)
    assert pool.free == 1000 and pool.free_mask().all()


def test_freed_slots_are_reused_lifo_and_zero_sized_calls_are_noops():
    pool = ColdPool(8)
    first = pool.allocate(3)
    pool.free_slots(first)
    assert np.array_equal(pool.allocate(3), first)  # deterministic reuse
    assert pool.allocate(0).size == 0
    pool.free_slots(np.empty(0, np.int64))
    assert pool.free == 5


def test_allocate_more_than_free_raises_and_changes_nothing():
    pool = ColdPool(4)
    pool.allocate(3)
    before = snapshot(pool)
    with pytest.raises(ValueError, match="2"):
        pool.allocate(2)
    with pytest.raises(ValueError, match="-1"):
        pool.allocate(-1)
    assert snapshot(pool) == before


@pytest.mark.parametrize("capacity", [-1, -100, 2.5, "8"])
def test_bad_capacity_names_the_value(capacity):
    with pytest.raises(ValueError, match=repr(capacity).replace(".", r"\.")):
        ColdPool(capacity)


def test_zero_capacity_pool_is_allowed_and_empty():
    # a granikv allocator with hot_fraction 1.0 has an empty COLD pool
    pool = ColdPool(0)
    assert pool.free == 0
    with pytest.raises(ValueError):
        pool.allocate(1)


def test_free_unknown_slot_raises_names_it_and_changes_nothing():
    pool = ColdPool(10, slot_start=20)
    live = pool.allocate(4)
    before = snapshot(pool)
    for bad in (19, 30, 1000):
        with pytest.raises(ValueError, match=str(bad)):
            pool.free_slots(np.array([live[0], bad]))
        assert snapshot(pool) == before


def test_double_free_raises_names_it_and_changes_nothing():
    pool = ColdPool(10)
    live = pool.allocate(4)
    pool.free_slots(live[:1])
    before = snapshot(pool)
    # a mix of live and already-free ids: nothing at all may be freed
    with pytest.raises(ValueError, match=rf"{int(live[0])}.*already free"):
        pool.free_slots(live)
    assert snapshot(pool) == before
    # never-allocated id inside the range
    never = np.setdiff1d(np.arange(10), live)[0]
    with pytest.raises(ValueError, match=str(int(never))):
        pool.free_slots(np.array([never]))
    assert snapshot(pool) == before


def test_repeated_id_in_one_free_raises_and_changes_nothing():
    pool = ColdPool(10)
    live = pool.allocate(4)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=rf"{int(live[1])}.*twice"):
        pool.free_slots(np.array([live[1], live[2], live[1]]))
    assert snapshot(pool) == before
    pool.free_slots(live)
    assert pool.free == 10


def test_ids_below_or_above_the_pool_are_not_in_it_even_when_every_slot_is_taken():
    """An id below ``slot_start`` must not wrap around to a live slot's index (numpy reads a
    negative index from the end), nor one above the pool pass. Shown to catch a planted bug: the
    check for ids below the pool removed (the id below then frees a live slot's flag)."""
    pool = ColdPool(10, slot_start=20)
    pool.allocate(10)
    before = snapshot(pool)
    for bad in (15, 19, 0, -3, 30, 31, 2**40):
        with pytest.raises(ValueError, match=rf"{bad}.*not in this pool"):
            pool.free_slots(np.array([bad]))
        assert snapshot(pool) == before


# ---- the counting pool (cost executor: COLD ids are never read) -------------------------------------
def test_counting_pool_counts_as_the_named_pool_does():
    """The same allocate / owe / free sequence leaves the same counts; a free of more than was taken is
    refused (double free), and what needs real ids is refused rather than answered wrongly."""
    from granisim.kv.cold_pool import CountingColdPool

    named, counted = ColdPool(50, slot_start=7), CountingColdPool(50, slot_start=7)
    for pool in (named, counted):
        a = pool.allocate(20)
        pool.owe(5)
        pool.take_owed(3)
        pool.free_slots(a[:12])
    assert (named.free, named.used, named._owed) == (counted.free, counted.used, counted._owed) == (37, 13, 2)
    assert counted.allocate(4).size == 4 and counted.free == 33
    with pytest.raises(ValueError, match="double free"):
        counted.free_slots(np.arange(20))
    with pytest.raises(ValueError, match="only 33 free"):
        counted.allocate(34)
    with pytest.raises(ValueError, match="names no free slots"):
        counted.free_mask()
    with pytest.raises(ValueError):  # its placeholder ids are one shared array: never written
        counted.allocate(2)[0] = 5
