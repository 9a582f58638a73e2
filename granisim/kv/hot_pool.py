"""HOT pool: contiguous slabs inside their own slot range.

A slab is a run of consecutive slots owned by one radix node (a shared prefix), so
attention can stream the whole prefix as one dense tile sequence. Free space is kept as
sorted, coalesced ranges. When free space exists but no single range is large enough,
``compact`` slides every slab towards the start of the pool and returns the KV copies an
executor must apply (source span -> destination span), in an order that is safe to apply
sequentially (each destination lies at or before its source).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class KVCopy:
    """Move ``length`` slots' K/V rows from ``src`` to ``dst`` (apply in list order)."""

    src: int
    dst: int
    length: int


class HotPool:
    """Slab allocator over slots ``[slot_start, slot_start + capacity)``."""

    def __init__(self, capacity: int, slot_start: int = 0):
        if not isinstance(capacity, (int, np.integer)) or capacity < 0:
            raise ValueError(f"hot pool capacity must be an integer >= 0, got {capacity!r}")
        self.capacity = int(capacity)
        self.slot_start = int(slot_start)
        self._slabs: dict[int, tuple[int, int]] = {}  # slab id -> (start, length)
        self._free_starts: list[int] = [self.slot_start] if capacity else []
        self._free_lens: list[int] = [self.capacity] if capacity else []
        self._next_id = 0
        self.compactions = 0
        self.copied_tokens = 0

    # ---- queries -------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return sum(self._free_lens)

    @property
    def used(self) -> int:
        return self.capacity - self.free

    @property
    def largest_free(self) -> int:
        return max(self._free_lens, default=0)

    def external_fragmentation(self) -> float:
        """1 - largest free range / total free (0 = one free run, ->1 = shattered)."""
        total = self.free
        return 0.0 if total == 0 else 1.0 - self.largest_free / total

    def span(self, slab: int) -> tuple[int, int]:
        """(start, length) of a live slab."""
        try:
            return self._slabs[slab]
        except KeyError:
            raise ValueError(f"hot pool: unknown slab id {slab!r}") from None

    def slabs(self) -> dict[int, tuple[int, int]]:
        return dict(self._slabs)

    def free_ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._free_starts, self._free_lens))

    def free_mask(self) -> np.ndarray:
        """Per-slot free flags (index = slot - slot_start), from the free ranges."""
        mask = np.zeros(self.capacity, bool)
        for start, length in zip(self._free_starts, self._free_lens):
            mask[start - self.slot_start : start - self.slot_start + length] = True
        return mask

    # ---- allocation ----------------------------------------------------------------------
    def allocate(self, n: int) -> int | None:
        """A slab of exactly ``n`` slots (best fit), or None when no free range is large enough."""
        if n <= 0:
            raise ValueError(f"hot pool: slab length must be >= 1, got {n}")
        best = -1
        for i, length in enumerate(self._free_lens):
            if length >= n and (best < 0 or length < self._free_lens[best]):
                best = i
                if length == n:
                    break
        if best < 0:
            return None
        start = self._free_starts[best]
        if self._free_lens[best] == n:
            del self._free_starts[best], self._free_lens[best]
        else:
            self._free_starts[best] += n
            self._free_lens[best] -= n
        slab = self._next_id
        self._next_id += 1
        self._slabs[slab] = (start, n)
        return slab

    def release(self, slab: int) -> None:
        """Free a slab, coalescing with free neighbours."""
        start, length = self.span(slab)
        del self._slabs[slab]
        self._insert_free(start, length)

    def grow(self, slab: int, extra: int) -> bool:
        """Extend a slab in place by ``extra`` slots if its right neighbour is free."""
        start, length = self.span(slab)
        if extra < 0:
            raise ValueError(f"hot pool: cannot grow by a negative amount ({extra})")
        end = start + length
        i = bisect.bisect_left(self._free_starts, end)
        if extra == 0:
            return True
        if i >= len(self._free_starts) or self._free_starts[i] != end or self._free_lens[i] < extra:
            return False
        if self._free_lens[i] == extra:
            del self._free_starts[i], self._free_lens[i]
        else:
            self._free_starts[i] += extra
            self._free_lens[i] -= extra
        self._slabs[slab] = (start, length + extra)
        return True

    def shrink(self, slab: int, new_length: int) -> None:
        """Give back the tail of a slab (keeps its first ``new_length`` slots)."""
        start, length = self.span(slab)
        if not 1 <= new_length <= length:
            raise ValueError(f"hot pool: cannot shrink slab of {length} to {new_length}")
        if new_length < length:
            self._slabs[slab] = (start, new_length)
            self._insert_free(start + new_length, length - new_length)

    def split(self, slab: int, head_length: int) -> int:
        """Cut a slab in two adjacent slabs; the original id keeps the head, returns the tail's id."""
        start, length = self.span(slab)
        if not 0 < head_length < length:
            raise ValueError(f"hot pool: cannot split slab of {length} at {head_length}")
        self._slabs[slab] = (start, head_length)
        tail = self._next_id
        self._next_id += 1
        self._slabs[tail] = (start + head_length, length - head_length)
        return tail

    def compact(self) -> list[KVCopy]:
        """Slide all slabs to the start of the pool in address order; returns the copies to apply."""
        copies: list[KVCopy] = []
        cursor = self.slot_start
        for slab, (start, length) in sorted(self._slabs.items(), key=lambda kv: kv[1][0]):
            if start != cursor:
                copies.append(KVCopy(src=start, dst=cursor, length=length))
                self._slabs[slab] = (cursor, length)
            cursor += length
        end = self.slot_start + self.capacity
        self._free_starts = [cursor] if cursor < end else []
        self._free_lens = [end - cursor] if cursor < end else []
        if copies:
            self.compactions += 1
            self.copied_tokens += sum(c.length for c in copies)
        return copies

    def _insert_free(self, start: int, length: int) -> None:
        i = bisect.bisect_left(self._free_starts, start)
        # merge with the left neighbour
        if i > 0 and self._free_starts[i - 1] + self._free_lens[i - 1] == start:
            i -= 1
            self._free_lens[i] += length
        else:
            self._free_starts.insert(i, start)
            self._free_lens.insert(i, length)
        # merge with the right neighbour
        if i + 1 < len(self._free_starts) and self._free_starts[i] + self._free_lens[i] == self._free_starts[i + 1]:
            self._free_lens[i] += self._free_lens[i + 1]
            del self._free_starts[i + 1], self._free_lens[i + 1]
