"""Paged pool: page math over a free list of page ids."""

import numpy as np
import pytest

from granisim.kv import PagedPool


def test_capacity_is_whole_pages_only():
    pool = PagedPool(100, page_size=16)
    assert pool.num_pages == 6 and pool.capacity == 96  # the partial 7th page is never used
    assert pool.free == 96 and pool.free_pages == 6 and pool.used == 0
    assert PagedPool(15, page_size=16).capacity == 0


def test_page_slots_and_pages_of_round_trip_with_offset():
    pool = PagedPool(64, page_size=4, slot_start=1000)
    pages = pool.allocate_pages(3)
    slots = pool.page_slots(pages)
    assert slots.size == 12
    expected = np.concatenate([1000 + 4 * p + np.arange(4) for p in pages])
    assert np.array_equal(slots, expected)
    assert np.array_equal(pool.pages_of(slots), pages)
    assert pool.free == 64 - 12 and pool.used == 12 and pool.free_pages == 13
    pool.free_page_ids(pages)
    assert pool.free == 64


def test_page_slots_of_known_pages():
    pool = PagedPool(48, page_size=16)
    assert pool.page_slots(np.array([2, 0])).tolist() == list(range(32, 48)) + list(range(16))


def test_page_size_one_is_token_granular():
    pool = PagedPool(5, page_size=1)
    pages = pool.allocate_pages(5)
    assert np.array_equal(np.sort(pool.page_slots(pages)), np.arange(5))


def test_pages_of_rejects_partial_pages():
    pool = PagedPool(32, page_size=16)
    with pytest.raises(ValueError, match="17"):
        pool.pages_of(np.arange(17))


@pytest.mark.parametrize("page_size", [0, -16, 1.5])
def test_bad_page_size_names_the_value(page_size):
    with pytest.raises(ValueError, match=repr(page_size).replace(".", r"\.")):
        PagedPool(64, page_size=page_size)


def test_bad_capacity_names_the_value():
    with pytest.raises(ValueError, match="-64"):
        PagedPool(-64, page_size=16)


def test_double_free_and_unknown_page_raise_and_change_nothing():
    pool = PagedPool(64, page_size=16)
    pages = pool.allocate_pages(2)
    pool.free_page_ids(pages[:1])
    before = (pool.free, pool._pages.free_mask().tobytes())
    with pytest.raises(ValueError, match=str(int(pages[0]))):
        pool.free_page_ids(pages)
    with pytest.raises(ValueError, match="9"):
        pool.free_page_ids(np.array([9]))
    assert (pool.free, pool._pages.free_mask().tobytes()) == before


def test_allocating_more_pages_than_free_raises():
    pool = PagedPool(32, page_size=16)
    pool.allocate_pages(1)
    with pytest.raises(ValueError, match="2"):
        pool.allocate_pages(2)
    assert pool.free_pages == 1
