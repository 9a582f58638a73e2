"""A decode step that repeats the previous one: its host metadata derived from that step's, not built again.

In steady decoding, step after step serves the same requests in the same groups, each one token further. With the
request table (request_table.py) such a step's metadata differs from the previous step's only in the rows' inputs
(token, position, KV write slot, table entry of the new token) and in each sequence's length (one more), so
`build` keeps what it made (a `Repeat`) and the next step, when it repeats this one (`Repeat.next`), is those
arrays with these fields replaced: per request a few integers through numpy, none of the per-request walks,
concatenations and bucketing of the full build. Byte for byte what `build` makes of the same plan with the same table
(tests/gpu_backend/test_request_table.py).

A step repeats the previous one when it has the same requests in the same order and the same groups, every request
decodes one token on top of exactly the previous step's tokens, each request's table row has room for it, no KV
moves (no copies, no transfers), it is padded as the previous one was, and every new slot is in range. Otherwise
`build` builds it in full.

This runs on the step's critical path (tens of us a step against a few hundred for a full build), so the checks
read each request's fields once, through `map` over the plan's own order, and compare them whole as Python lists
with what the previous step predicts (at 64 requests cheaper than numpy arrays); numpy does only the row writes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np

from granisim.core.contract import BatchPlan


_RID, _CTX, _NEW = attrgetter("rid"), attrgetter("context_len"), attrgetter("num_new")
_PREFILL, _TOKENS, _SLOTS = attrgetter("is_prefill"), attrgetter("input_tokens"), attrgetter("new_slots")
_LAYOUT_TOKENS = attrgetter("layout.num_tokens")
_GROUP = attrgetter("path", "prefix_len", "members")
# A request's one new slot or input token as a Python int: ValueError when its array holds another number of them
# (the full build then lays the rows out, or hands them to the reference), TypeError when it is no array
_ONE = np.ndarray.item
_KV = ("dec_max_kv", "dec_mean_kv", "suffix_max_kv", "suffix_mean_kv")  # the StepShape lengths a repeat advances


def key(plan: BatchPlan) -> tuple:
    """What a repeating step shares with the previous one: its requests, in order, and its groups."""
    return tuple(map(_RID, plan.requests)), tuple(map(_GROUP, plan.groups))


@dataclass
class Repeat:
    """What the previous step's full build made, and where each request sits in it. While steps repeat, the
    requests' token counts live here (`tokens`), not in their table rows: `release` writes them back.

    The arguments list requests in row order (`order`); what `next` reads per request is kept in the plan's order, so
    that a step's fields are read straight off its plan."""

    key: tuple
    pad: bool
    host: object  # rows.HostStep
    order: list[int]  # plan indices in row order (decode rows, then pass members): every plan index once
    rows: list  # each request's table row (request_table._Row), in `order`
    bases: np.ndarray  # per request: its row's first entry
    starts: np.ndarray  # per request: the first token its row holds
    step_rows: np.ndarray  # per request: its row in the step
    lens_at: tuple[int, int]  # index in `host.small` of the decode lengths, of the suffix lengths
    lens_rows: tuple[np.ndarray, np.ndarray]  # per decode / grouped request: its index in those arrays
    page: int
    bucket_len: object  # the length bucketing the step was padded with

    def __post_init__(self):
        # `next` reads each request's fields off the plan in the plan's order: move what it pairs them with there
        row_of = [0] * len(self.order)  # plan index -> its index in row order
        for k, i in enumerate(self.order):
            row_of[i] = k
        self.rows = [self.rows[k] for k in row_of]
        row_of = np.array(row_of, np.intp)
        self.bases, self.starts, self.step_rows = self.bases[row_of], self.starts[row_of], self.step_rows[row_of]
        self.rids, self.groups = self.key
        # what the next step's requests must hold: context_len, the tokens each row covers; a layout of one more
        self.context_lens = [row.tokens for row in self.rows]
        self.tokens = np.array(self.context_lens, np.int64)
        self.kv_lens = (self.tokens + 1).tolist()
        self.ones = [1] * len(self.rows)  # num_new
        # repeats left before some row's block is full (each repeat adds one token to every row)
        ends = self.starts + np.array([row.cap for row in self.rows], np.int64) * self.page
        self.room = int((ends - self.tokens).min(initial=np.iinfo(np.int64).max))
        # the longest and mean (rounded up) decode and suffix lengths, before bucketing: each repeat adds one
        dec, suffix = (self.host.small[at][where] for at, where in zip(self.lens_at, self.lens_rows))
        self.raw_kv = [int(dec.max(initial=0)), _mean(dec), int(suffix.max(initial=0)), _mean(suffix)]  # as _KV
        self.grows = [dec.size > 0] * 2 + [suffix.size > 0] * 2
        # per lengths field, 1 on each request's entry and 0 on the pads': added, each request's length one more
        self.lens_add = []
        for at, where in zip(self.lens_at, self.lens_rows):
            self.lens_add.append(ones := np.zeros_like(self.host.small[at]))
            ones[where] = 1
        self.kv = tuple(map(self.host.shape.__getattribute__, _KV))

    def release(self) -> None:
        """Write the token counts back into the rows (the step after the last repeat is built in full)."""
        for row, n in zip(self.rows, self.tokens.tolist()):
            row.tokens = n

    def next(self, plan: BatchPlan, num_slots: int, pad: bool):
        """The HostStep of `plan` if it repeats this step, else None (build it in full)."""
        reqs = plan.requests
        if (pad != self.pad or plan.copies or plan.transfers or self.room <= 0
                or tuple(map(_RID, reqs)) != self.rids or tuple(map(_GROUP, plan.groups)) != self.groups
                or any(map(_PREFILL, reqs)) or list(map(_NEW, reqs)) != self.ones
                or list(map(_CTX, reqs)) != self.context_lens):
            return None
        try:
            if list(map(_LAYOUT_TOKENS, reqs)) != self.kv_lens:  # the full build raises on a layout of other length
                return None
            new = np.fromiter(map(_ONE, map(_SLOTS, reqs)), np.int64, len(reqs))
            toks = np.fromiter(map(_ONE, map(_TOKENS, reqs)), np.int64, len(reqs))
        except (AttributeError, TypeError, ValueError):  # no layout, no arrays, or not one slot and token each
            return None
        if new.size and new.view(np.uint64).max() >= num_slots:  # one pass: a negative slot reads as a huge one
            return None
        ctx = self.tokens
        self.tokens = ctx + 1
        self.context_lens, self.kv_lens = self.kv_lens, (self.tokens + 1).tolist()
        self.room -= 1
        h = self.host
        small = h.small.copy()
        # the rows' inputs: token, position, KV write slot (fields 0-2) and the new token's table entry (4)
        for field, values in zip((0, 1, 2, 4), (toks, ctx, new, self.bases + (ctx - self.starts) // self.page)):
            small[field] = a = small[field].copy()
            a[self.step_rows] = values
        for at, ones in zip(self.lens_at, self.lens_add):
            small[at] = small[at] + ones
        self.raw_kv = [v + g for v, g in zip(self.raw_kv, self.grows)]
        kv, shape = tuple(map(self.bucket_len, self.raw_kv)), h.shape
        if kv != self.kv:
            shape = replace(shape, **dict(zip(_KV, kv)))
            self.kv = kv
        self.host = type(h)(shape, small, h.big, h.sample_of, h.table_entries)
        return self.host


def _mean(a: np.ndarray) -> int:
    return -(-int(a.sum()) // a.size) if a.size else 0
