"""Which entries of the device request table hold which request's KV ids: the bookkeeping, integers only.

A decode step reads every request's whole context (`token`, `paged`) or its suffix after the group prefix
(`granikv`'s grouped rows). Listed afresh each step, that is every id of every context copied and uploaded per
step: 64 requests x 16K tokens is a million ids, milliseconds of host work on the step's clock. Between two steps
a decoding request's ids only grow: a live request's token never changes slot unless a plan moves it (a HOT
compaction copy or a host-tier transfer). So, as SGLang's `req_to_token` table and vLLM's persistent block table
do, each request keeps its ids in a row of one device buffer (the arena's `table`): written whole once, when the
request first decodes (a *patch*), then extended on the device by each step's new tokens (the step's *appends*:
entry `base + (position - start) // page` gets `new_slot // page`, inside the step's graph). The host hands the
kernels a page table over the buffer: per sequence, its row's first entry and its length (`PageTable` with the
table as indices; page 1 for slot ids, the `paged` policy's page size for page ids). Per step that is a few
integers a request instead of its every id.

A row is reused only while nothing can have moved its ids: it was written for the same request and start in the
previous step and covers every token but this step's new ones, and no plan since moved KV (copies or transfers
reset the whole table). A request absent from a step, or prefilling in it, loses its row. Rows are blocks of a
power-of-two number of entries, at least twice the row's length when written (and `MIN_ROW`), reused by size: a
request is patched again only once its context has doubled. Entry 0 is never a row's: padded rows append there,
and nothing reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_ROW = 256  # entries of the smallest block
PAD_ENTRY = 0  # the appends of padded rows land here; no row holds it
SPARE = 1 << 20  # entries the table may hold beyond four times its live rows' blocks before it starts afresh


@dataclass
class _Row:
    start: int  # first token of the request the row holds (0: whole context; else the group prefix's length)
    base: int  # entry of token `start`
    cap: int  # entries of the block
    tokens: int  # tokens of the request the row covers (start + entries written, in tokens)


class RequestTable:
    def __init__(self):
        self.page = 0  # tokens an entry covers (fixed by the first step: 1, or the paged policy's page size)
        self._rows: dict[int, _Row] = {}
        self._free: dict[int, list[int]] = {}  # block size -> free bases
        self.end = PAD_ENTRY + 1  # entries handed out so far (the device buffer needs this many)
        self.held = 0  # entries in the blocks of live rows
        self.resets = 0
        self.patched = 0  # entries written from the host, over the run
        self.repeat = None  # the previous step's metadata, which a step repeating it derives its own from (rows_repeat)

    def reset(self) -> None:
        """Forget every row (their ids may have moved): each request is patched again when it next decodes."""
        self._rows.clear()
        self._free.clear()
        self.repeat = None
        self.end = PAD_ENTRY + 1
        self.held = 0
        self.resets += 1

    def begin(self, page: int, moves_kv: bool) -> None:
        """Start a step whose sequences are read `page` tokens an entry; `moves_kv`: its plan copies or transfers
        KV (every row may be stale). Blocks are reused by size only, so when the table has grown to four times what
        its rows hold (past a floor of `SPARE` entries) it starts afresh too."""
        if page != self.page or moves_kv or self.end > 4 * self.held + SPARE:
            if self._rows or self.end > PAD_ENTRY + 1:
                self.reset()
            self.page = page
        self._seen: set[int] = set()

    def locate(self, rid: int, start: int, kv_len: int, num_new: int) -> tuple[int, bool]:
        """The row holding request `rid`'s tokens `start..kv_len - 1` this step (`num_new` of them new): its base
        entry, and whether it must be patched whole from the host (else the step only appends its new tokens)."""
        self._seen.add(rid)
        need = -(-(kv_len - start) // self.page)
        row = self._rows.get(rid)
        if row is not None and row.start == start and row.tokens == kv_len - num_new and row.cap >= need:
            row.tokens = kv_len
            return row.base, False
        if row is not None:
            self._release(row)
        cap = max(MIN_ROW, 1 << (2 * need - 1).bit_length())
        free = self._free.get(cap)
        if free:
            base = free.pop()
        else:
            base, self.end = self.end, self.end + cap
        self._rows[rid] = _Row(start, base, cap, kv_len)
        self.held += cap
        self.patched += need
        return base, True

    def row(self, rid: int) -> _Row:
        """Request `rid`'s row (rows_repeat extends it in place)."""
        return self._rows[rid]

    def _release(self, row: _Row) -> None:
        self._free.setdefault(row.cap, []).append(row.base)
        self.held -= row.cap

    def finish(self) -> None:
        """End the step: rows of requests it did not read through the table are freed."""
        for rid in [rid for rid in self._rows if rid not in self._seen]:
            self._release(self._rows.pop(rid))
