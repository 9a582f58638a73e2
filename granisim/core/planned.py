"""A plan's requests as columns: :class:`PlannedRequests`, a sequence of :class:`PlannedRequest`.

The batch builder makes one plan per step with every running request in it; building a frozen
``PlannedRequest`` per request per plan was the largest single cost of a simulated step. The cost
executor, the step log and the scheduler read the columns (plain lists, one value per request);
indexing and iteration build the ``PlannedRequest`` objects on demand, equal to the ones the builder
made before. Plans for executors that move data (slots, input tokens, layouts) keep a tuple.
"""

from __future__ import annotations

from collections.abc import Sequence

from granisim.core.contract import PlannedRequest, planned_request


class PlannedRequests(Sequence):
    """Columns ``rid``, ``context_len``, ``num_new``, ``is_prefill``, ``group``, ``shared_len`` (lists
    of equal length); ``new_slots``, ``input_tokens`` and ``layout`` are None for every request.

    ``n_decode``, when not None, says how the rows are ordered (the batch builder's plans): rows
    ``0 .. n_decode - 1`` are decode rows (not prefill, one new token each) and every later row is a
    prefill row, so readers need no pass to find them. It is not part of the sequence's value.

    Two columns may come in a cheaper form and are built when first read: ``decode_contexts`` (with
    ``n_decode``), the decode rows' contexts as :class:`DecodeContexts` (``context_len`` then holds the
    later rows' only; ``decode_sums`` and ``decode_groups`` read its sums without the column); and
    ``group_rows``, ``(row indices, prefix length)`` of each group in order, instead of ``group`` and
    ``shared_len`` (None)."""

    __slots__ = ("rid", "_context_len", "num_new", "is_prefill", "_group", "_shared_len", "n_decode", "_decode",
                 "_later", "_group_rows")

    def __init__(self, rid: list[int], context_len: list[int], num_new: list[int], is_prefill: list[bool],
                 group: list[int] | None, shared_len: list[int] | None, n_decode: int | None = None,
                 decode_contexts: DecodeContexts | None = None, group_rows: list | None = None):
        self.rid, self.num_new, self.is_prefill = rid, num_new, is_prefill
        self._group, self._shared_len, self._group_rows = group, shared_len, group_rows
        self.n_decode = n_decode
        self._decode = decode_contexts
        self._context_len, self._later = (None, context_len) if decode_contexts is not None else (context_len, None)

    @property
    def context_len(self) -> list[int]:
        c = self._context_len
        if c is None:  # built on first read
            c = self._context_len = self._decode.tolist() + self._later
        return c

    @property
    def group(self) -> list[int]:
        if self._group is None:
            self._fill_groups()
        return self._group

    @property
    def shared_len(self) -> list[int]:
        if self._shared_len is None:
            self._fill_groups()
        return self._shared_len

    def _fill_groups(self) -> None:
        self._group, self._shared_len = group_columns(len(self.rid), self._group_rows or ())

    @property
    def decode_sums(self) -> tuple[int, int] | None:
        """(sum, max) of the decode rows' contexts when known without the column (else None)."""
        d = self._decode
        return (d.sum, d.max) if d is not None else None

    @property
    def decode_groups(self) -> dict | None:
        """{group node id or -1: (decode rows, their context sum, their longest context)} of the decode
        rows when known without the columns (else None)."""
        d = self._decode
        return d.groups[1] if d is not None and d.groups is not None else None

    def row_context(self, i: int) -> int:
        """``context_len[i]`` (0 <= i < len) without building the column."""
        c = self._context_len
        if c is None:
            d = self._decode
            return self._later[i - d.n] if i >= d.n else d.at(i)
        return c[i]

    def __len__(self) -> int:
        return len(self.rid)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        d = self._decode
        if self._context_len is None and i >= 0:  # a row's context without building the column
            ctx = self._later[i - d.n] if i >= d.n else d.at(i)
        else:
            ctx = self.context_len[i]
        return planned_request(self.rid[i], ctx, self.num_new[i], self.is_prefill[i], self.group[i],
                               self.shared_len[i])

    def __iter__(self):
        return map(planned_request, self.rid, self.context_len, self.num_new, self.is_prefill, self.group,
                   self.shared_len)

    def __eq__(self, other) -> bool:
        if isinstance(other, (PlannedRequests, tuple)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other):
        return tuple(self) + tuple(other)

    def __radd__(self, other):
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return f"PlannedRequests({list(self)!r})"


class DecodeContexts:
    """The decode rows' contexts as ``keys[i] + now`` (a snapshot of the scheduler's keys), with their
    sum and maximum (granisim.core.decode_batch). ``groups``, when some row has a prefix group: (each
    row's group node id or -1 as an array, {node id or -1: (rows, context sum, longest context)})."""

    __slots__ = ("keys", "now", "n", "sum", "max", "groups")

    def __init__(self, keys: list[int], now: int, key_sum: int, key_max: int,
                 groups: tuple | None = None):
        self.keys, self.now, self.n = keys, now, len(keys)
        self.sum = key_sum + self.n * now
        self.max = key_max + now
        self.groups = groups

    def at(self, i: int) -> int:
        return self.keys[i] + self.now

    def tolist(self) -> list[int]:
        return list(map(self.now.__add__, self.keys))


def group_columns(n_rows: int, group_rows) -> tuple[list[int], list[int]]:
    """The group and shared-prefix columns of ``n_rows`` rows from each group's (row indices, prefix length)."""
    group, shared = [-1] * n_rows, [0] * n_rows
    for gno, (idx, prefix_len) in enumerate(group_rows):
        for i in idx:
            group[i] = gno
            shared[i] = prefix_len
    return group, shared


def columns(requests: Sequence[PlannedRequest]) -> PlannedRequests:
    """``requests`` as columns (itself when it is already)."""
    if isinstance(requests, PlannedRequests):
        return requests
    return PlannedRequests([r.rid for r in requests], [r.context_len for r in requests],
                           [r.num_new for r in requests], [r.is_prefill for r in requests],
                           [r.group for r in requests], [r.shared_len for r in requests])


def is_plain(requests: Sequence[PlannedRequest]) -> bool:
    """True when no request carries slots, input tokens or a layout (columns lose nothing)."""
    return isinstance(requests, PlannedRequests) or all(
        r.new_slots is None and r.input_tokens is None and r.layout is None for r in requests)
