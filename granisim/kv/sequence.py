"""A live request's KV bookkeeping (``_Seq``), the table of live requests (``Requests``)
and the slot-run test the layouts use.

Kept apart from the allocator because it is plain per-request state. The allocator owns
the one :class:`Requests` table and is the only part that adds or removes records; it
hands single records to :class:`granisim.kv.hot_slabs.HotSlabs` (slab placement and
caching) and the whole table to :class:`granisim.kv.views.AllocatorViews` (read only).
"""

from __future__ import annotations

import numpy as np

from granisim.kv.radix import RadixNode, path_to
from granisim.lagging import lagging

_EMPTY = np.empty(0, np.int64)


def path_slots(node: RadixNode) -> np.ndarray:
    """Slots of every token on the radix path from the root down to ``node``."""
    vals = [n.value for n in path_to(node)]
    return np.concatenate(vals) if vals else _EMPTY


def run_starts(slots: np.ndarray) -> np.ndarray:
    """Start positions of the maximal runs of consecutive ascending ids in ``slots`` (empty for no slots): a
    host-tier transfer crosses the link as one copy a run (granisim/kv/host_tier.py, the engine's HostKV)."""
    s = np.asarray(slots)
    if s.size == 0:
        return np.empty(0, np.int64)
    return np.concatenate([[0], np.flatnonzero(s[1:] - s[:-1] != 1) + 1])


def _is_run(slots: np.ndarray) -> bool:
    """True when ``slots`` are consecutive ascending ids (first/last alone is not enough:
    HOT runs placed out of address order, e.g. [0, 2, 1, 3], span the right range)."""
    return bool(slots.size) and bool((slots[1:] - slots[:-1] == 1).all())  # np.diff, without its wrapper


class GrowthClock:
    """Tokens added to every request of a tracked set at once (``KVAllocator.grow_tracked``): a tracked
    ``_Seq`` has ``now - _gat`` more owed slots and new tokens than its own counters say."""

    __slots__ = ("now",)

    def __init__(self):
        self.now = 0


class _Seq:
    """A live request: tokens [0, cached_len) on a locked radix path, then an optional
    reserved HOT slab of slab_len tokens (filled first), then private slots priv[:n_priv].

    The last ``owed`` private slots may be counted but not yet picked (``KVAllocator.grow``): the
    pool ``_owed_pool`` owes them, and reading ``priv`` picks them first. A tracked request
    (``_growth``, a :class:`GrowthClock`) also has the clock's tokens since ``_gat`` in ``owed`` and
    ``n_new``, counted in when either is read."""

    __slots__ = ("rid", "node", "cached_len", "shared_len", "slab", "slab_len", "_n_new", "group", "_buf", "_lo",
                 "_hi", "_owed", "_owed_pool", "_growth", "_gat")

    def __init__(self, rid: int, node: RadixNode, cached_len: int, shared_len: int):
        self.rid = rid
        self.node = node
        self.cached_len = cached_len
        self.shared_len = shared_len
        self.slab: int | None = None
        self.slab_len = 0
        self._n_new = 0  # tokens allocated beyond cached_len
        self.group: tuple[int, int, str] | None = None  # (node id, shared tokens, storage)
        # reserved private slots (paged: whole pages) are _buf[_lo:_hi]; the first push (a prompt's slots)
        # gets a buffer of its size, later ones grow it by doubling so that a decode step's append is O(1)
        # amortised (the cost executor's decode slots come in one push, at the end: see ``owed``)
        self._buf = _EMPTY
        self._lo = self._hi = 0
        self._owed = 0
        self._owed_pool = None  # the ColdPool (owe / take_owed) that grow() may owe slots from
        self._growth: GrowthClock | None = None
        self._gat = 0

    def sync(self) -> None:
        """Count the growth clock's tokens since ``_gat`` in (owed slots, one new token each)."""
        d = self._growth.now - self._gat
        if d:
            self._owed += d
            self._n_new += d
            self._gat += d

    owed = lagging("_owed", "_growth", "sync")
    n_new = lagging("_n_new", "_growth", "sync")

    @property
    def priv(self) -> np.ndarray:
        if self.owed:
            self.settle()
        return self._buf[self._lo : self._hi]

    def settle(self) -> None:
        """Pick the ids of the owed slots (they go after the slots held so far)."""
        n, self.owed = self.owed, 0
        self.push(self._owed_pool.take_owed(n))

    def push(self, slots: np.ndarray) -> None:
        n = slots.size
        if self._hi + n > self._buf.size:
            live = self._hi - self._lo
            buf = np.empty(max(16, 2 * (live + n)) if live else n, np.int64)
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


class _CountedSeq(_Seq):
    """A ``_Seq`` whose private slots a counting pool (:class:`granisim.kv.cold_pool.CountingColdPool`)
    only counts: it keeps how many it holds, not which, and its ``priv`` is that many placeholder ids
    (a read-only view of the pool's, never copied)."""

    __slots__ = ("_ids",)

    def __init__(self, rid: int, node: RadixNode, cached_len: int, shared_len: int, ids: np.ndarray):
        super().__init__(rid, node, cached_len, shared_len)
        self._ids = ids

    @property
    def priv(self) -> np.ndarray:
        if self.owed:
            self.settle()
        return self._ids[: self._hi]

    def push(self, slots: np.ndarray) -> None:
        self._hi += slots.size

    def drop_front(self, k: int) -> None:
        self._hi -= k


class Requests:
    """Live requests by id, in admission order."""

    __slots__ = ("_seqs",)

    def __init__(self):
        self._seqs: dict[int, _Seq] = {}

    def __contains__(self, rid: int) -> bool:
        return rid in self._seqs

    def __iter__(self):
        return iter(self._seqs.values())

    def __len__(self) -> int:
        return len(self._seqs)

    def ids(self) -> list[int]:
        return list(self._seqs)

    def add(self, seq: _Seq) -> None:
        if seq.rid in self._seqs:
            raise ValueError(f"request id {seq.rid} is already admitted")
        self._seqs[seq.rid] = seq

    def get(self, rid: int) -> _Seq:
        try:
            return self._seqs[rid]
        except KeyError:
            raise ValueError(f"unknown request id {rid!r} (never admitted or already released)") from None

    def remove(self, rid: int) -> None:
        del self._seqs[rid]
