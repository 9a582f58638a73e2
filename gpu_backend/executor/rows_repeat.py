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
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np

from granisim.core.contract import BatchPlan


_RID, _CTX, _NEW = attrgetter("rid"), attrgetter("context_len"), attrgetter("num_new")
_PREFILL, _TOKENS, _SLOTS = attrgetter("is_prefill"), attrgetter("input_tokens"), attrgetter("new_slots")
_LAYOUT_TOKENS = attrgetter("layout.num_tokens")
_KV = ("dec_max_kv", "dec_mean_kv", "suffix_max_kv", "suffix_mean_kv")  # the StepShape lengths a repeat advances


def key(plan: BatchPlan) -> tuple:
    """What a repeating step shares with the previous one: its requests, in order, and its groups."""
    return tuple(map(_RID, plan.requests)), tuple((g.path, g.prefix_len, g.members) for g in plan.groups)


@dataclass
class Repeat:
    """What the previous step's full build made, and where each request sits in it. While steps repeat, the
    requests' token counts live here (`tokens`), not in their table rows: `release` writes them back."""

    key: tuple
    pad: bool
    host: object  # rows.HostStep
    order: list[int]  # plan indices in row order (decode rows, then pass members)
    rows: list  # each request's table row (request_table._Row), in `order`
    bases: np.ndarray  # per request: its row's first entry
    starts: np.ndarray  # per request: the first token its row holds
    step_rows: np.ndarray  # per request: its row in the step
    lens_at: tuple[int, int]  # index in `host.small` of the decode lengths, of the suffix lengths
    lens_rows: tuple[np.ndarray, np.ndarray]  # per decode / grouped request: its index in those arrays
    page: int
    bucket_len: object  # the length bucketing the step was padded with

    def __post_init__(self):
        self.tokens = np.array([row.tokens for row in self.rows], np.int64)  # tokens each row covers
        self.limits = self.starts + np.array([row.cap for row in self.rows], np.int64) * self.page  # rows' ends
        # the longest and mean (rounded up) decode and suffix lengths, before bucketing: each repeat adds one
        dec, suffix = (self.host.small[at][where] for at, where in zip(self.lens_at, self.lens_rows))
        self.raw_kv = [int(dec.max(initial=0)), _mean(dec), int(suffix.max(initial=0)), _mean(suffix)]  # as _KV
        self.grows = [dec.size > 0] * 2 + [suffix.size > 0] * 2

    def release(self) -> None:
        """Write the token counts back into the rows (the step after the last repeat is built in full)."""
        for row, n in zip(self.rows, self.tokens.tolist()):
            row.tokens = n

    def next(self, plan: BatchPlan, num_slots: int, pad: bool):
        """The HostStep of `plan` if it repeats this step, else None (build it in full)."""
        if pad != self.pad or plan.copies or plan.transfers or key(plan) != self.key:
            return None
        reqs = plan.requests
        rq = list(map(reqs.__getitem__, self.order))
        n = len(rq)
        try:
            tokens = np.fromiter(map(_LAYOUT_TOKENS, rq), np.int64, n)
        except AttributeError:  # a request without a layout: the full build raises
            return None
        ctx = np.fromiter(map(_CTX, rq), np.int64, n)
        if any(map(_PREFILL, rq)) or list(map(_NEW, rq)).count(1) != n:
            return None
        # one token on top of exactly the previous step's, within the row's block
        if not ((ctx == self.tokens).all() and (tokens == ctx + 1).all() and (ctx < self.limits).all()):
            return None
        new = np.concatenate(list(map(_SLOTS, rq)))
        toks = np.concatenate(list(map(_TOKENS, rq)))
        if new.size != n or toks.size != n or new.min() < 0 or new.max() >= num_slots:
            return None
        self.tokens += 1
        h = self.host
        small = list(h.small)
        # the rows' inputs: token, position, KV write slot (fields 0-2) and the new token's table entry (4)
        for field, values in zip((0, 1, 2, 4), (toks, ctx, new, self.bases + (ctx - self.starts) // self.page)):
            small[field] = a = small[field].copy()
            a[self.step_rows] = values
        for at, where in zip(self.lens_at, self.lens_rows):
            small[at] = a = small[at].copy()
            a[where] += 1
        self.raw_kv = [v + g for v, g in zip(self.raw_kv, self.grows)]
        kv, shape = tuple(map(self.bucket_len, self.raw_kv)), h.shape
        if kv != tuple(map(shape.__getattribute__, _KV)):
            shape = replace(shape, **dict(zip(_KV, kv)))
        self.host = type(h)(shape, small, h.big, h.sample_of, h.table_entries)
        return self.host


def _mean(a: np.ndarray) -> int:
    return -(-int(a.sum()) // a.size) if a.size else 0
