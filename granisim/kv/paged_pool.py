"""Paged pool: the uniform baseline that hands out whole pages of ``page_size`` slots.

vLLM's default is 16, SGLang's is 1. Page ``p`` covers slots ``[p*N, (p+1)*N)`` (plus the
pool's slot offset). Pages are managed by a :class:`ColdPool` over page ids.
"""

from __future__ import annotations

import numpy as np

from granisim.kv.cold_pool import SLOT_DTYPE, ColdPool


class PagedPool:
    def __init__(self, capacity_tokens: int, page_size: int, slot_start: int = 0):
        if not isinstance(page_size, (int, np.integer)) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        if not isinstance(capacity_tokens, (int, np.integer)) or capacity_tokens < 0:
            raise ValueError(f"paged pool capacity must be an integer >= 0, got {capacity_tokens!r}")
        self.page_size = int(page_size)
        self.slot_start = int(slot_start)
        self.num_pages = int(capacity_tokens) // self.page_size
        self.capacity = self.num_pages * self.page_size  # a partial last page is never used
        self._pages = ColdPool(self.num_pages, 0, name="paged")

    @property
    def free(self) -> int:
        return self._pages.free * self.page_size

    @property
    def used(self) -> int:
        return self.capacity - self.free

    @property
    def free_pages(self) -> int:
        return self._pages.free

    def free_mask(self) -> np.ndarray:
        """Per-slot free flags (index = slot - slot_start), from the page flags."""
        return np.repeat(self._pages.free_mask(), self.page_size)

    def allocate_pages(self, n_pages: int) -> np.ndarray:
        return self._pages.allocate(n_pages)

    def free_page_ids(self, pages: np.ndarray) -> None:
        self._pages.free_slots(pages)

    def page_slots(self, pages: np.ndarray) -> np.ndarray:
        """All slots of the given pages, in page order."""
        p = np.asarray(pages, dtype=SLOT_DTYPE)
        return (self.slot_start + p[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1)

    def pages_of(self, slots: np.ndarray) -> np.ndarray:
        """Page ids of page-aligned whole-page slot runs (first slot of each page)."""
        s = np.asarray(slots, dtype=SLOT_DTYPE)
        if s.size % self.page_size:
            raise ValueError(f"paged pool: {s.size} slots is not a whole number of pages of {self.page_size}")
        return (s[:: self.page_size] - self.slot_start) // self.page_size
