"""A live request's KV bookkeeping (``_Seq``) and the slot-run test the layouts use.

Kept apart from the allocator because it is plain per-request state: the allocator, its
HOT-slab side and its views all read it, and none of them needs the others to do so.
"""

from __future__ import annotations

import numpy as np

from granisim.kv.radix import RadixNode

_EMPTY = np.empty(0, np.int64)


def _is_run(slots: np.ndarray) -> bool:
    """True when ``slots`` are consecutive ascending ids (first/last alone is not enough:
    HOT runs placed out of address order, e.g. [0, 2, 1, 3], span the right range)."""
    return bool(slots.size) and bool((np.diff(slots) == 1).all())


class _Seq:
    """A live request: tokens [0, cached_len) on a locked radix path, then an optional
    reserved HOT slab of slab_len tokens (filled first), then private slots priv[:n_priv]."""

    __slots__ = ("rid", "node", "cached_len", "shared_len", "slab", "slab_len", "n_new", "group", "_buf", "_lo",
                 "_hi")

    def __init__(self, rid: int, node: RadixNode, cached_len: int, shared_len: int):
        self.rid = rid
        self.node = node
        self.cached_len = cached_len
        self.shared_len = shared_len
        self.slab: int | None = None
        self.slab_len = 0
        self.n_new = 0  # tokens allocated beyond cached_len
        self.group: tuple[int, int, str] | None = None  # (node id, shared tokens, storage)
        # reserved private slots (paged: whole pages) are _buf[_lo:_hi]; the buffer grows by
        # doubling so that a decode step's append is O(1) amortised
        self._buf = _EMPTY
        self._lo = self._hi = 0

    @property
    def priv(self) -> np.ndarray:
        return self._buf[self._lo : self._hi]

    def push(self, slots: np.ndarray) -> None:
        n = slots.size
        if self._hi + n > self._buf.size:
            live = self._hi - self._lo
            buf = np.empty(max(16, 2 * (live + n)), np.int64)
            buf[:live] = self._buf[self._lo : self._hi]
            self._buf, self._lo, self._hi = buf, 0, live
        self._buf[self._hi : self._hi + n] = slots
        self._hi += n

    def drop_front(self, k: int) -> None:
        self._lo += k

    @property
    def n_priv(self) -> int:
        return max(0, self.n_new - self.slab_len)

    @property
    def num_tokens(self) -> int:
        return self.cached_len + self.n_new
