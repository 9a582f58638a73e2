"""Private-token stores: where a request's non-shared tokens get their slots.

``TokenStore`` takes single slots from a :class:`ColdPool` (GraniKV's COLD pool, or the
whole budget for the ``token`` policy); ``PageStore`` hands out whole pages. A request's
private slots are kept as a reserved array plus a used count, so a page's spare slots
stay with the request until it fills them (internal fragmentation, reported in stats).
"""

from __future__ import annotations

import numpy as np

from granisim.kv.cold_pool import ColdPool
from granisim.kv.paged_pool import PagedPool


class _Store:
    """What both stores share: the pool they draw from, its capacity and free tokens."""

    name: str
    page_size: int

    def __init__(self, pool):
        self.pool = pool

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    @property
    def free(self) -> int:
        return self.pool.free

    def free_mask(self) -> np.ndarray:
        """Per-slot free flags of the pool (index = slot - the pool's first slot)."""
        return self.pool.free_mask()


class TokenStore(_Store):
    page_size = 1

    def __init__(self, pool: ColdPool):
        super().__init__(pool)
        self.name = pool.name

    def need(self, spare: int, n: int) -> int:
        """Pool tokens consumed to add ``n`` tokens when ``spare`` reserved slots are unused."""
        return max(0, n - spare)

    def reserve(self, spare: int, n: int) -> np.ndarray:
        return self.pool.allocate(self.need(spare, n))

    def release(self, slots: np.ndarray) -> None:
        self.pool.free_slots(slots)


class PageStore(_Store):
    def __init__(self, pool: PagedPool):
        super().__init__(pool)
        self.name = "paged"
        self.page_size = pool.page_size

    def need(self, spare: int, n: int) -> int:
        extra = max(0, n - spare)
        return -(-extra // self.page_size) * self.page_size

    def reserve(self, spare: int, n: int) -> np.ndarray:
        pages = self.pool.allocate_pages(self.need(spare, n) // self.page_size)
        return self.pool.page_slots(pages)

    def release(self, slots: np.ndarray) -> None:
        self.pool.free_page_ids(self.pool.pages_of(slots))
