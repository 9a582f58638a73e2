"""HOT pool: contiguous slabs, coalescing, grow/split, compaction copies, fragmentation."""

import numpy as np
import pytest

from granisim.kv import HotPool, KVCopy


def snapshot(pool: HotPool):
    return pool.free, pool.slabs(), pool.free_ranges(), pool.compactions, pool.copied_tokens


def carve(pool: HotPool, lengths):
    """Allocate slabs of the given lengths back to back; returns their ids."""
    ids = [pool.allocate(n) for n in lengths]
    assert None not in ids
    return ids


def test_allocate_exact_lengths_back_to_back_and_free_all():
    pool = HotPool(100, slot_start=1000)
    a, b = carve(pool, [10, 30])
    assert pool.span(a) == (1000, 10) and pool.span(b) == (1010, 30)
    assert (pool.free, pool.used, pool.largest_free) == (60, 40, 60)
    assert pool.free_ranges() == [(1040, 60)]
    pool.release(a)
    pool.release(b)
    assert pool.free_ranges() == [(1000, 100)] and pool.slabs() == {}


def test_allocate_returns_none_when_no_run_is_long_enough():
    pool = HotPool(10)
    carve(pool, [4, 2, 4])
    before = snapshot(pool)
    assert pool.allocate(1) is None
    assert snapshot(pool) == before
    assert HotPool(5).allocate(6) is None


def test_best_fit_picks_the_smallest_run_that_fits():
    pool = HotPool(20)
    a, _, c, _ = carve(pool, [5, 1, 3, 1])  # free tail: (10, 10)
    pool.release(a)  # free (0, 5)
    pool.release(c)  # free (6, 3)
    s = pool.allocate(3)
    assert pool.span(s) == (6, 3)  # exact fit beats the 5 and the 10
    s = pool.allocate(4)
    assert pool.span(s) == (0, 4)  # 5 beats 10


def test_release_coalesces_left_right_and_both():
    pool = HotPool(40)
    a, b, c, d = carve(pool, [10, 10, 10, 10])
    pool.release(a)
    pool.release(c)
    assert pool.free_ranges() == [(0, 10), (20, 10)]
    pool.release(b)  # merges with the left (a) and the right (c) range
    assert pool.free_ranges() == [(0, 30)]
    pool.release(d)  # merges with the left range only
    assert pool.free_ranges() == [(0, 40)]


def test_release_merges_right_neighbour_only():
    pool = HotPool(30)
    a, b, c = carve(pool, [10, 10, 10])
    pool.release(c)
    pool.release(b)  # right neighbour free, left (a) live
    assert pool.free_ranges() == [(10, 20)]
    assert pool.span(a) == (0, 10)


def test_grow_in_place_when_the_right_neighbour_is_free():
    pool = HotPool(30)
    a, b = carve(pool, [10, 10])
    pool.release(b)
    assert pool.grow(a, 5)
    assert pool.span(a) == (0, 15) and pool.free_ranges() == [(15, 15)]
    assert pool.grow(a, 15)  # takes the whole free run
    assert pool.span(a) == (0, 30) and pool.free_ranges() == []
    assert pool.grow(a, 0)


def test_grow_refused_when_the_neighbour_is_live_or_too_short():
    pool = HotPool(30)
    a, b, _ = carve(pool, [10, 10, 5])  # free tail (25, 5)
    before = snapshot(pool)
    assert not pool.grow(a, 1)  # b sits right after a
    assert snapshot(pool) == before
    pool.release(b)
    assert not pool.grow(a, 11)  # only 10 free right after a
    assert pool.span(a) == (0, 10) and pool.free_ranges() == [(10, 10), (25, 5)]
    with pytest.raises(ValueError, match="-1"):
        pool.grow(a, -1)


def test_split_makes_two_adjacent_slabs():
    pool = HotPool(20)
    a = pool.allocate(12)
    tail = pool.split(a, 5)
    assert pool.span(a) == (0, 5) and pool.span(tail) == (5, 7)
    assert pool.free == 8
    pool.release(a)
    assert pool.free_ranges() == [(0, 5), (12, 8)]
    for bad in (0, 7, 8):
        with pytest.raises(ValueError, match=str(bad)):
            pool.split(tail, bad)


def test_shrink_gives_back_the_tail_coalesced():
    pool = HotPool(20)
    a = pool.allocate(12)
    pool.shrink(a, 4)
    assert pool.span(a) == (0, 4) and pool.free_ranges() == [(4, 16)]


def test_external_fragmentation_on_a_hand_made_layout():
    pool = HotPool(100)
    ids = carve(pool, [10, 20, 10, 30, 10, 20])  # fills the pool
    assert pool.external_fragmentation() == 0.0  # nothing free
    pool.release(ids[1])  # free 20 at 10
    assert pool.external_fragmentation() == 0.0  # one run
    pool.release(ids[3])  # free 30 at 40
    pool.release(ids[5])  # free 20 at 80
    # free 70 total, largest run 30
    assert pool.free == 70 and pool.largest_free == 30
    assert pool.external_fragmentation() == pytest.approx(1 - 30 / 70)


def apply(copies, mem):
    """Replay copies in order on a simulated KV memory (one value per slot)."""
    for c in copies:
        mem[c.dst : c.dst + c.length] = mem[c.src : c.src + c.length].copy()


def test_compaction_copies_are_safe_in_order_and_leave_one_free_run():
    pool = HotPool(64, slot_start=0)
    ids = carve(pool, [5, 7, 3, 9, 4, 6, 8])  # 42 used
    for i in (0, 2, 5):
        pool.release(ids[i])
    live = {s: pool.span(s) for s in (ids[1], ids[3], ids[4], ids[6])}
    mem = np.full(64, -1)
    for s, (start, length) in live.items():
        mem[start : start + length] = s * 100 + np.arange(length)  # each slab's own content
    assert pool.external_fragmentation() > 0

    copies = pool.compact()
    assert copies and all(isinstance(c, KVCopy) for c in copies)
    # every destination lies at or before its source and never over a later copy's source
    for i, c in enumerate(copies):
        assert c.dst <= c.src
        for later in copies[i + 1 :]:
            assert c.dst + c.length <= later.src or c.dst >= later.src + later.length
    apply(copies, mem)
    cursor = 0
    for s in sorted(live, key=lambda s: live[s][0]):  # address order is kept
        start, length = pool.span(s)
        assert start == cursor and length == live[s][1]
        assert np.array_equal(mem[start : start + length], s * 100 + np.arange(length))
        cursor += length
    assert pool.free_ranges() == [(cursor, 64 - cursor)]
    assert pool.external_fragmentation() == 0.0
    assert pool.compactions == 1 and pool.copied_tokens == sum(c.length for c in copies)


def test_compaction_with_overlapping_move_is_applied_forward():
    pool = HotPool(12)
    a, b = carve(pool, [2, 8])
    pool.release(a)
    copies = pool.compact()
    assert copies == [KVCopy(src=2, dst=0, length=8)]  # source and destination overlap
    mem = np.arange(12)
    apply(copies, mem)
    assert mem[:8].tolist() == list(range(2, 10))
    assert pool.span(b) == (0, 8)


def test_compaction_of_a_packed_pool_copies_nothing():
    pool = HotPool(10)
    carve(pool, [3, 3])
    assert pool.compact() == []
    assert pool.compactions == 0 and pool.free_ranges() == [(6, 4)]


@pytest.mark.parametrize("capacity", [-1, 1.5, "4"])
def test_bad_capacity_names_the_value(capacity):
    with pytest.raises(ValueError, match=repr(capacity).replace(".", r"\.")):
        HotPool(capacity)


def test_bad_slab_length_names_it():
    pool = HotPool(10)
    for n in (0, -3):
        with pytest.raises(ValueError, match=str(n)):
            pool.allocate(n)
    assert pool.free == 10


def test_release_unknown_or_already_freed_slab_raises_and_changes_nothing():
    pool = HotPool(30)
    a, b, _ = carve(pool, [5, 5, 5])
    pool.release(b)
    before = snapshot(pool)
    for bad in (b, 12345, -1):
        with pytest.raises(ValueError, match=str(bad)):
            pool.release(bad)
        assert snapshot(pool) == before
    with pytest.raises(ValueError, match=str(b)):
        pool.grow(b, 1)
    with pytest.raises(ValueError, match=str(b)):
        pool.span(b)
    assert snapshot(pool) == before
    pool.release(a)
