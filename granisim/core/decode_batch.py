"""The decoding requests of a scheduler, in running order, stepped together by one clock.

A plain decode step gives every decoding request one token: ``computed``, ``n_tokens`` and
``generated`` all grow by one. Instead of a pass over the requests per plan, the batch counts the
steps once on a :class:`~granisim.core.request.DecodeClock`; a request on the clock catches up when
one of its counters is read (:class:`~granisim.core.request.Request`'s properties). What a plan
needs of the batch is kept as requests join (their first token) and leave (finish or preemption):

* each member's context as ``computed - clock`` in running order (constant while it decodes: both
  grow by one a step), and its prefix group; per group (and for the members without one) the count,
  sum and maximum of those keys, so a plan prices its decode rows without a pass over them;
* when each member on the clock finishes (the clock value at which ``generated`` reaches
  ``output_len``), in a heap: a step's finishers are what it pops and the fast-forward limit is its
  top;
* those finish values again as an array, for the scheduler's outstanding-output reserve.

A member whose declared shared prefix is not cached yet is *special*: its step also caches the prefix
(``Scheduler._apply``), so it keeps its own counters and the scheduler steps it alone; it joins the
clock once its prefix is cached. Its context still grows by one a step, so its key stays valid.

Whoever changes members' counters without the clock (a step with real sampled tokens, one request at
a time) calls :meth:`rebuild` afterwards.
"""

from __future__ import annotations

import heapq

import numpy as np

from granisim.core.planned import DecodeContexts
from granisim.core.request import DecodeClock, Request


def _plain(r: Request) -> bool:
    """Its decode step is one token and nothing else (its declared prefix, if any, is cached)."""
    return r.prefix_cached or not r.spec.shared_len


class DecodeBatch:
    """A mapping rid -> decoding request in running order (``values()``, iteration over rids,
    ``len``, ``in``, ``[rid]``), with the clock and the per-member state above."""

    def __init__(self):
        self.clock = DecodeClock()
        self._reqs: dict[int, Request] = {}
        self._order: list[Request] = []  # the members in running order
        self._rids: list[int] = []  # their ids, in the same order (the keys of _reqs)
        self._keys: list[int] = []  # computed - clock.now of each, in running order
        self._gk = np.empty(64, np.int64)  # each one's prefix group node id (-1: none), in running order
        self._stats: dict[int, list] = {}  # group node id (-1: none) -> [members, key sum, key max or None]
        self.special: dict[int, Request] = {}  # members off the clock, in running order
        self._heap: list[tuple[int, int, Request]] = []  # (finish clock, admit_order, member on the clock)
        # members on the clock, each at a slot: their finish clocks and (n_tokens - computed) summed
        self._fin = np.empty(64, np.int64)
        self._slot: dict[int, int] = {}
        self._slotted: list[Request] = []
        self._held = 0  # sum of n_tokens - computed of the slotted members
        self._fin_sum = 0  # sum of their finish clocks
        self._members: tuple[list[Request], list[int]] | None = None  # members(), until one joins or leaves

    # ---- a mapping in running order ----------------------------------------------------------
    def __len__(self) -> int:
        return len(self._reqs)

    def __iter__(self):
        return iter(self._reqs)

    def __contains__(self, rid) -> bool:
        return rid in self._reqs

    def __getitem__(self, rid) -> Request:
        return self._reqs[rid]

    def values(self):
        return self._reqs.values()

    def members(self) -> tuple[list[Request], list[int]]:
        """``(list(self.values()), list(self))``: the same two lists, never changed, until a member joins or
        leaves (a plan per step reads them; the batch changes far less often)."""
        m = self._members
        if m is None:
            m = self._members = (self._order[:], self._rids[:])
        return m

    # ---- joining and leaving ------------------------------------------------------------------
    def join(self, r: Request) -> None:
        """``r`` (off any clock, its counters current) starts decoding; running order is admit_order."""
        self._members = None
        order = self._order
        key = r.computed - self.clock.now
        g = _group_key(r)
        self._count(g, key)
        n = len(order)
        if n == self._gk.size:
            self._gk = np.concatenate([self._gk, np.empty(n, np.int64)])
        gk = self._gk
        if not order or order[-1].admit_order < r.admit_order:
            self._reqs[r.rid] = r
            order.append(r)
            self._rids.append(r.rid)
            self._keys.append(key)
            gk[n] = g
        else:  # an earlier-admitted request decodes after a later one: insert it at its place
            pos = sum(1 for q in order if q.admit_order < r.admit_order)
            order.insert(pos, r)
            self._rids.insert(pos, r.rid)
            self._keys.insert(pos, key)
            gk[pos + 1 : n + 1] = gk[pos:n].copy()
            gk[pos] = g
            self._reqs = {q.rid: q for q in order}
            if not _plain(r):
                self.special = {q.rid: q for q in order if q.rid in self.special or q is r}
                return
        if _plain(r):
            self._on_clock(r)
        else:
            self.special[r.rid] = r

    def promote(self, r: Request) -> None:
        """A special member whose prefix is now cached goes on the clock."""
        del self.special[r.rid]
        g = _group_key(r)
        pos = self._order.index(r)
        if g != self._gk[pos]:  # caching its prefix gave it a group
            self._uncount(int(self._gk[pos]), self._keys[pos])
            self._count(g, self._keys[pos])
            self._gk[pos] = g
        self._on_clock(r)

    def leave(self, r: Request) -> None:
        """``r`` stops decoding (finished or preempted); its counters are brought up to date."""
        self._members = None
        rid = r.rid
        pos = self._order.index(r)
        stats = self._stats
        if len(stats) == 1 and -1 in stats:  # no member has a group: every kept group id is -1, none moves
            self._uncount(-1, self._keys[pos])
            del self._reqs[rid], self._order[pos], self._keys[pos], self._rids[pos]
        else:
            self._uncount(int(self._gk[pos]), self._keys[pos])
            del self._reqs[rid], self._order[pos], self._keys[pos], self._rids[pos]
            n = len(self._order)
            self._gk[pos:n] = self._gk[pos + 1 : n + 1]
        if self.special.pop(rid, None) is None:
            self._off_clock(r)

    def _count(self, g: int, key: int) -> None:
        st = self._stats.get(g)
        if st is None:
            self._stats[g] = [1, key, key]
        else:
            st[0] += 1
            st[1] += key
            if st[2] is not None and key > st[2]:
                st[2] = key

    def _uncount(self, g: int, key: int) -> None:
        st = self._stats[g]
        if st[0] == 1:
            del self._stats[g]
            return
        st[0] -= 1
        st[1] -= key
        if key == st[2]:
            st[2] = None  # found again when next read

    def _max(self, g: int) -> int:
        st = self._stats[g]
        if st[2] is None:
            st[2] = max(k for k, h in zip(self._keys, self._gk[: len(self._keys)].tolist()) if h == g)
        return st[2]

    def _on_clock(self, r: Request) -> None:
        now = self.clock.now
        fin = now + r.output_len - r.generated
        r._clock, r._at = self.clock, now
        heapq.heappush(self._heap, (fin, r.admit_order, r))
        slot = len(self._slotted)
        if slot == self._fin.size:
            self._fin = np.concatenate([self._fin, np.empty(slot, np.int64)])
        self._fin[slot] = fin
        self._fin_sum += fin
        self._slot[r.rid] = slot
        self._slotted.append(r)
        self._held += r._n_tokens - r._computed

    def _off_clock(self, r: Request) -> None:
        r._sync()
        r._clock = None
        slot = self._slot.pop(r.rid)
        self._fin_sum -= int(self._fin[slot])
        last = self._slotted.pop()
        if last is not r:  # the last slot's member moves into the hole
            self._slotted[slot] = last
            self._slot[last.rid] = slot
            self._fin[slot] = self._fin[len(self._slotted)]
        self._held -= r._n_tokens - r._computed

    def _current(self, entry) -> bool:
        """A heap entry of a member still on the clock with that finish value (else left behind)."""
        fin, order, r = entry
        slot = self._slot.get(r.rid)
        return slot is not None and r.admit_order == order and self._fin[slot] == fin

    # ---- what plans read ------------------------------------------------------------------------
    @property
    def any_group(self) -> bool:
        """Some member has a prefix group."""
        return len(self._stats) > (-1 in self._stats)

    def contexts(self) -> DecodeContexts:
        """``[r.computed for r in self.values()]`` as a :class:`DecodeContexts` (a snapshot), with each
        prefix group's member count, context sum and longest context when some member has a group."""
        now, stats = self.clock.now, self._stats
        if not self.any_group:  # (the common case without shared prefixes: one set of keys)
            st = stats.get(-1)
            return DecodeContexts(self._keys[:], now, st[1], self._max(-1)) if st else DecodeContexts([], now, 0, 0)
        by_group = {g: (st[0], st[1] + st[0] * now, self._max(g) + now) for g, st in stats.items()}
        total = sum(st[1] for st in stats.values())
        longest = max((v[2] for v in by_group.values()), default=now) - now
        return DecodeContexts(self._keys[:], now, total, longest, (self._gk[: len(self._keys)].copy(), by_group))

    def advance(self, steps: int) -> list[Request]:
        """Every member on the clock takes ``steps`` decode steps; returns those that reached their
        output length (still members: the scheduler finishes them), in running order: ``steps`` never
        passes a member's last output (the fast-forward limit), so they all finish now and the heap
        gives them in admit order."""
        now = self.clock.now = self.clock.now + steps
        heap, due = self._heap, []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._current(entry):
                if entry[0] != now:
                    raise ValueError(f"decode batch: {steps} steps pass request {entry[2].rid}'s last output")
                due.append(entry[2])
        return due

    def min_remaining(self) -> int | None:
        """The fewest outputs any member has left (None without members)."""
        heap = self._heap
        while heap and not self._current(heap[0]):
            heapq.heappop(heap)
        left = [heap[0][0] - self.clock.now] if heap else []
        if self.special:
            left += [r.output_len - r.generated for r in self.special.values()]
        return min(left) if left else None

    def outstanding(self, ratio: float) -> int:
        """``sum(int(ratio * (r.output_len - r.generated)) + (r.n_tokens - r.computed))`` over the members
        on the clock (the same products, truncated as int() truncates them: they are not negative)."""
        n = len(self._slotted)
        if not n:
            return 0
        left = self._fin[:n] - self.clock.now
        return int(_add(np.multiply(ratio, left).astype(np.int64))) + self._held

    def outstanding_bound(self, ratio: float) -> int:
        """An upper bound of ``outstanding(ratio)`` without a pass: the products summed before truncating
        (int(ratio * sum) + 1 covers the sum's rounding for any sum below 2**40)."""
        n = len(self._slotted)
        return int(ratio * (self._fin_sum - n * self.clock.now)) + 1 + self._held if n else 0

    def rebuild(self) -> None:
        """Members' counters were changed one by one (not by the clock): derive the state again."""
        members = self._order
        self._members = None
        for r in self._slotted:
            r._sync()
            r._clock = None
        self._reqs, self._order, self._rids, self._keys, self._stats, self.special = {}, [], [], [], {}, {}
        self._heap, self._slot, self._slotted, self._held, self._fin_sum = [], {}, [], 0, 0
        for r in members:
            self.join(r)


_add = np.add.reduce  # ndarray.sum without its Python wrapper


def _group_key(r: Request) -> int:
    return r.group[0] if r.group is not None else -1
