"""Host side of one step: which plan request takes which rows, padded to bucketed shapes.

Rows are laid out by attention region, each region a contiguous slice of the step's tokens:

    [extend (prefill chunks)] [decode (whole-context reads)] [prefix pass 0] [prefix pass 1] ...

so every launch reads a slice, never a gather. Every region is padded to a bucketed size
(padded rows write their K/V to the scratch slot, read no KV, and their outputs are dropped),
and every host integer a launcher sizes its grid by (rows, groups, longest sequence) is
bucketed too. The shapes a step launches with are then a function of its `StepShape` alone:
steps with equal shapes replay one CUDA graph (executor.py), with new metadata copied into
the same device buffers (arena.py).

All slot ids are checked here against the KV buffers, so no launch needs a device read.

The build is host work on every step's critical path, so per request it only collects views of the ids a region
reads (`_reads`: a request's slot arrays, sliced where its range starts or stops inside one); each field is then
one concatenation, cast to int32 on the way, and range-checked without a copy per request. A page table copies
only its pages' first ids (`_page_ids`). `rows_reference.build_reference` is the per-request construction this
replaced, kept as its oracle: the same fields, byte for byte.

The engine builds with a request table (request_table.py): decode rows and grouped rows' suffixes then list no id
at all but name their request's row of a device table, which holds every id it was ever given (checked as it was
written); a decode step that repeats the previous one is derived from it (rows_repeat.py). Without a table the
fields are those of the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from itertools import accumulate, repeat
from typing import NamedTuple

import numpy as np

from granisim.core.contract import BatchPlan

from .request_table import PAD_ENTRY, RequestTable
from .rows_repeat import Repeat, key as repeat_key

PASS_ORDER = (("cascade", False), ("cascade", True), ("dense", True))  # (path, prefix is one slab)


def bucket(n: int) -> int:
    """Row/sequence counts: up to 128 (memory-bound GEMMs, where pad rows cost ~nothing) steps of a
    quarter of the enclosing power of two (exact to 4); beyond, multiples of 32 (< 25% pad)."""
    if n <= 0:
        return 0
    step = max(1, (1 << (n - 1).bit_length()) // 4) if n <= 128 else 32
    return -(-n // step) * step


def bucket_len(n: int) -> int:
    """Longest / mean sequence lengths (split planning only): steps of 256 tokens or an eighth power of
    two (< 25% pad)."""
    if n <= 0:
        return 0
    step = max(256, (1 << (n - 1).bit_length()) // 8)
    return -(-n // step) * step


def _mean(sizes) -> int:
    sizes = list(sizes)
    return -(-sum(sizes) // len(sizes)) if sizes else 0


@dataclass(frozen=True)
class PassShape:
    path: str
    slab: bool
    rows: int  # padded member rows
    groups: int  # padded group count
    max_group: int
    max_prefix: int
    mean_prefix: int


@dataclass(frozen=True)
class StepShape:
    """Everything a step's launches are sized by: equal shapes -> one CUDA graph."""

    page_size: int  # decode storage: page table of this size, or slot lists when 0
    ext_rows: int
    ext_reqs: int
    ext_max_qo: int
    dec_rows: int
    dec_max_kv: int
    dec_mean_kv: int  # mean lengths: the split-KV launches balance mixed lengths by them
    passes: tuple[PassShape, ...]
    suffix_max_kv: int
    suffix_mean_kv: int
    table: bool = False  # decode and suffix rows read the request table (request_table.py), else listed ids

    @property
    def grouped_rows(self) -> int:
        return sum(p.rows for p in self.passes)

    @property
    def num_rows(self) -> int:
        return self.ext_rows + self.dec_rows + self.grouped_rows

    @property
    def sample_rows(self) -> int:
        """Rows whose logits are computed: each extend request's last row, then every other row."""
        return self.ext_reqs + self.dec_rows + self.grouped_rows


@dataclass
class HostStep:
    shape: StepShape
    small: list[np.ndarray]  # fixed-size int32 fields, sizes given by `shape` (arena order)
    big: dict[str, np.ndarray]  # variable-length int32 index lists (CSR indices, page ids)
    sample_of: dict[int, int]  # rid -> index into the sampled rows
    table_entries: int = 0  # entries the device request table needs (0: no table)

    @cached_property
    def small_ids(self) -> int:
        """Ids of the fixed-size fields together (the arena stages them one after another): the arena's fit check
        and its upload both read it, every step."""
        return sum(a.size for a in self.small)


_PATHS = ("cascade", "dense")  # the paths with a prefix pass
_EMPTY = np.empty(0, np.int64)
_UNSIGNED = {np.dtype(f"i{n}"): np.dtype(f"u{n}") for n in (1, 2, 4, 8)}  # native signed -> unsigned, same size
# Range checks: pieces of at least this many ids on average are checked one by one (a reduction each, whose ~1 us of
# call overhead is then less than copying every id into one array to check them in one call)
_PIECE_IDS = 4096


def _ptr(sizes, n_padded: int) -> np.ndarray:
    """CSR pointers of `sizes`, followed by empty sequences up to `n_padded` (int32)."""
    ptr = list(accumulate(sizes, initial=0))
    if n_padded >= len(ptr):
        ptr += [ptr[-1]] * (n_padded + 1 - len(ptr))
    return np.array(ptr, np.int32)


def _pad(a, n: int) -> np.ndarray:
    out = np.zeros(n, np.int32)
    out[: len(a)] = a
    return out


def _cat(arrays: list) -> np.ndarray:
    return np.concatenate(arrays) if arrays else _EMPTY


def _exact(n: int) -> int:
    return max(n, 0)


class Reads(NamedTuple):
    """Sequences of slot ids, one a layout, as views of the layouts' arrays (no id copied): all sequences' pieces
    in order, each piece's offset into its sequence, and each sequence's length."""

    pieces: list[np.ndarray]
    offsets: list[int]
    lens: list[int]


def _reads(layouts, starts=None, limits=None) -> Reads:
    """Each layout's slot ids from token `starts[k]` on (0 when not given), at most `limits[k]` of them (all when
    not given): `layout.slots()[start:start + limit]` of each, in pieces (one a segment they touch, sliced where
    they start or stop inside one)."""
    pieces, offsets, lens = [], [], []
    for lay, skip, limit in zip(layouts, starts or repeat(0), limits or repeat(None)):
        n = 0
        for seg in lay.segments:
            a = seg.slots
            if skip:  # the range starts in a later segment, or inside this one
                if skip >= a.size:
                    skip -= a.size
                    continue
                a, skip = a[skip:], 0
            if limit is not None:  # the range stops inside this segment, or before it
                if n >= limit:
                    break
                a = a[: limit - n]
            pieces.append(a)
            offsets.append(n)
            n += a.size
        lens.append(n)
    return Reads(pieces, offsets, lens)


def _outside(a: np.ndarray, num_slots: int) -> bool:
    """Whether any id lies outside [0, num_slots): for signed integers one pass (a negative id reads as a huge
    unsigned one)."""
    if not a.size:
        return False
    unsigned = _UNSIGNED.get(a.dtype)
    if unsigned is not None:
        return bool(np.maximum.reduce(a.view(unsigned)) >= num_slots)  # a.max() less its Python wrapper
    return bool(a.min() < 0 or a.max() >= num_slots)


def _one_by_one(pieces: list[np.ndarray]) -> bool:
    """Whether to range-check `pieces` one by one rather than on their concatenation (_PIECE_IDS)."""
    return bool(pieces) and len(pieces) * _PIECE_IDS <= sum(map(len, pieces))


def _any_outside(pieces: list[np.ndarray], num_slots: int) -> bool:
    """Whether any id of `pieces` lies outside [0, num_slots)."""
    if _one_by_one(pieces):
        return any(_outside(a, num_slots) for a in pieces)
    return _outside(_cat(pieces), num_slots)


def _checked_ids(pieces: list[np.ndarray], num_slots: int) -> np.ndarray | None:
    """`_cat(pieces).astype(np.int32)`, or None when an id lies outside [0, num_slots): large pieces checked one by
    one, then copied once, cast on the way (the same C cast as astype); small ones concatenated, checked in one
    call, then cast."""
    if _one_by_one(pieces):
        if any(_outside(a, num_slots) for a in pieces):
            return None
        return np.concatenate(pieces, dtype=np.int32, casting="unsafe")
    ids = _cat(pieces)
    return None if _outside(ids, num_slots) else ids.astype(np.int32)


def _page_ids(reads: Reads, page_size: int) -> np.ndarray:
    """The page ids of sequences that each start on a page boundary: every `page_size`-th id of each, // page_size
    (`seq[::page_size] // page_size`). Taken from each piece, no other id copied: a piece `offset` ids into its
    sequence holds its pages' first ids from index -offset % page_size on."""
    firsts = _cat([a[-offset % page_size:: page_size] for a, offset in zip(reads.pieces, reads.offsets)])
    if page_size & (page_size - 1) == 0 and firsts.dtype.kind in "iu":  # a power of two, as every policy's:
        return firsts >> (page_size.bit_length() - 1)  # a shift, the same on ids >= 0 and 3x faster
    return firsts // page_size


def _storage(reads: Reads, n_padded: int, page_size: int, num_slots: int,
             small: list[np.ndarray]) -> np.ndarray | None:
    """The sequences of `reads` as a page table (page_size > 0: page indptr and lengths appended to `small`, page
    ids returned; each sequence starts on a page boundary) or as slot lists (indptr appended, ids returned);
    None when one of their ids lies outside [0, num_slots)."""
    if not page_size:
        small.append(_ptr(reads.lens, n_padded))
    else:
        small += [_ptr([-(-n // page_size) for n in reads.lens], n_padded), _pad(reads.lens, n_padded)]
    return _listed_ids(reads, page_size or 1, num_slots)


def _listed_ids(reads: Reads, page: int, num_slots: int) -> np.ndarray | None:
    """The ids a storage lists for the sequences of `reads`: slot ids (page 1, int32) or their pages' ids (each
    sequence starting on a page boundary); None when one of their slots lies outside [0, num_slots)."""
    if page == 1:
        return _checked_ids(reads.pieces, num_slots)
    return None if _any_outside(reads.pieces, num_slots) else _page_ids(reads, page)


class GroupPrefix(NamedTuple):
    """A group's shared prefix as its first member holds it: one slab (start, size) or listed slot ids."""

    slab: bool
    start: int
    size: int
    ids: np.ndarray | None  # None for a slab: no list to build (a 16K prefix is 16K ids per group per step)


def _group_prefix(layout, n: int) -> GroupPrefix:
    """The first `n` tokens of `layout` as a GroupPrefix (not range-checked: `build` checks every id at once)."""
    seg = layout.segments[0] if layout.segments else None
    if n and seg is not None and seg.slab is not None and seg.slab[1] >= n:  # the allocator marked the run
        return GroupPrefix(True, seg.slab[0], n, None)
    ids = layout.slots()[:n]
    slab = bool(ids.size) and bool((np.diff(ids) == 1).all())
    return GroupPrefix(slab, int(ids[0]) if slab else 0, int(ids.size), ids)


def _reference(plan: BatchPlan, num_slots: int, pad: bool, table: RequestTable | None = None) -> HostStep:
    """A plan off the fast path (a bad id, a dense group that is no slab, rows that do not match `num_new`):
    the per-request construction raises the ValueError naming the first bad id, or builds what it always built
    (listed ids: the request table, which this step does not extend, is reset)."""
    from .rows_reference import build_reference

    if table is not None:
        table.reset()
    return build_reference(plan, num_slots, pad)


class _TableRows:
    """The sequences a step reads through the request table: per sequence its row's base and length (appended to
    the step's fixed-size fields in a page table's form), and the rows to write whole from the host."""

    def __init__(self, table: RequestTable):
        self.table = table
        self.patch_bases: list[int] = []
        self.patch_layouts: list = []
        self.patch_starts: list[int] = []

    def add(self, reqs, starts) -> tuple[list[int], list[int]]:
        """Locate each request's row (its tokens from `starts[k]` on): the rows' bases and lengths in tokens."""
        bases, lens, locate = [], [], self.table.locate
        for r, s in zip(reqs, starts):
            base, whole = locate(r.rid, s, r.kv_len, r.num_new)
            if whole:
                self.patch_bases.append(base)
                self.patch_layouts.append(r.layout)
                self.patch_starts.append(s)
            bases.append(base)
            lens.append(r.kv_len - s)
        return bases, lens

    def patches(self, num_slots: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(entries, values) of the rows written whole this step; None when an id lies outside [0, num_slots)."""
        page = self.table.page
        reads = _reads(self.patch_layouts, self.patch_starts)
        ids = None if any(s % page for s in self.patch_starts) else _listed_ids(reads, page, num_slots)
        if ids is None:
            return None
        sizes = np.array([-(-n // page) for n in reads.lens], np.int64)
        first = np.cumsum(sizes) - sizes
        dst = np.repeat(np.array(self.patch_bases, np.int64) - first, sizes) + np.arange(int(sizes.sum()))
        return dst.astype(np.int32), ids.astype(np.int32, copy=False)


def build(plan: BatchPlan, num_slots: int, pad: bool = True, table: RequestTable | None = None) -> HostStep:
    """Row regions, metadata and shape of one plan, padded to buckets (`pad`, for graph replays) or
    exact (eager steps); ValueError before any launch on a bad id.

    Per request, only a walk over its layout's segments that collects views of the ids each region reads
    (`_reads`); each field is then one concatenation (a page table's: of its pages' first ids only), range-checked
    as it is made, and each region's rows are one slice. Byte for byte what `rows_reference.build_reference`
    builds request by request (tests/gpu_backend); a plan off this path (a bad id, a dense group that is no slab,
    rows that do not match `num_new`) is handed to it.

    With a request `table` (request_table.py) the decode rows' contexts and the grouped rows' suffixes are read
    through it instead: per request its row's base and length, the ids of rows it has to write whole (`big`'s
    `tdst`, `tids`), and per step row the table entry its new token goes to (after `sample` in `small`); a decode
    step that repeats the previous one is derived from it (rows_repeat.py)."""
    if table is not None and table.repeat is not None:
        host = table.repeat.next(plan, num_slots, pad)
        if host is not None:
            return host
        table.repeat.release()
        table.repeat = None
    bucket_n, bucket_l = (bucket, bucket_len) if pad else (_exact, _exact)
    reqs = plan.requests
    grouped = {i: g for g in plan.groups if g.path in _PATHS for i in g.members}
    ext, dec = [], []
    for i, r in enumerate(reqs):
        if r.layout is None or r.layout.num_tokens != r.kv_len:
            raise ValueError(f"plan step {plan.step}: request {r.rid} has no layout for {r.kv_len} tokens")
        if r.is_prefill:
            ext.append(i)
        elif i not in grouped:
            dec.append(i)
    # prefix passes: one launch per (path, storage), groups stacked, in PASS_ORDER
    by_pass: dict[tuple[str, bool], list] = {}
    for g in plan.groups:
        if g.path in _PATHS:
            first = _group_prefix(reqs[g.members[0]].layout, g.prefix_len)
            if g.path == "dense" and not first.slab:
                return _reference(plan, num_slots, pad, table)  # raises: the dense path reads one slab
            by_pass.setdefault((g.path, first.slab), []).append((g, first))
    pass_keys = [k for k in PASS_ORDER if k in by_pass]
    pass_members = [[i for g, _ in by_pass[k] for i in g.members] for k in pass_keys]
    members = [i for ms in pass_members for i in ms]
    # the rows, region after region: [extend] [decode] [pass 0] [pass 1] ...
    rq = [reqs[i] for i in (*ext, *dec, *members)]
    n_ext, n_dec = len(ext), len(dec)
    nn = [r.num_new for r in rq]
    ext_sizes = nn[:n_ext]
    ext_rows, ext_reqs, dec_rows = bucket_n(sum(ext_sizes)), bucket_n(n_ext), bucket_n(n_dec)
    rows_of_pass = [bucket_n(len(ms)) for ms in pass_members]

    # the ids each region reads, range-checked as its field is made, and every other id the reference checks (a
    # bad one anywhere and it raises, naming the first): the KV writes, extend rows' whole layouts (they read the
    # first context_len ids, then write the rest), group prefixes as their first members hold them. The `paged`
    # policy's own contexts are read through its page table, as vLLM's kernels read them.
    ps = plan.page_size if plan.policy == "paged" else 0
    small: list[np.ndarray] = [_ptr(ext_sizes, ext_reqs)]
    ext_lays = [r.layout for r in rq[:n_ext]]
    ext_ids = _storage(_reads(ext_lays, limits=[r.context_len for r in rq[:n_ext]]), ext_reqs, ps, num_slots, small)
    suffix_starts = [grouped[i].prefix_len for i in members]
    if table is None:
        dec_reads = _reads([r.layout for r in rq[n_ext: n_ext + n_dec]])  # whole contexts
        dec_ids = _storage(dec_reads, dec_rows, ps, num_slots, small)
        dec_lens = dec_reads.lens
        suffix = _reads([reqs[i].layout for i in members], suffix_starts)
        suffix_ids = _checked_ids(suffix.pieces, num_slots)
        suffix_of = suffix.lens
    else:
        table.begin(ps or 1, bool(plan.copies or plan.transfers))
        rows_of_table = _TableRows(table)
        dec_bases, dec_lens = rows_of_table.add(rq[n_ext: n_ext + n_dec], repeat(0))
        small += [_pad(dec_bases, dec_rows + 1), _pad(dec_lens, dec_rows)]
        dec_at = len(small) - 1
        suffix_bases, suffix_of = rows_of_table.add([reqs[i] for i in members], suffix_starts)
        dec_ids = suffix_ids = _EMPTY  # no id listed: a step reads its rows' ids from the table
    new = _cat([r.new_slots for r in rq])  # every KV write of the step (the plan's order is the reference's)
    prefixes = [f for k in pass_keys for _, f in by_pass[k]]
    slab_ends = np.array([(f.start, f.start + f.size - 1) for f in prefixes if f.ids is None], np.int64).ravel()
    if (ext_ids is None or dec_ids is None or suffix_ids is None or _outside(new, num_slots)
            or _outside(slab_ends, num_slots) or _any_outside(_reads(ext_lays).pieces, num_slots)
            or _any_outside([f.ids for f in prefixes if f.ids is not None], num_slots)):
        return _reference(plan, num_slots, pad, table)  # raises, naming the first bad id as it always has
    big = {"ext": ext_ids, "dec": dec_ids}
    passes = []
    for n, (key, rows) in enumerate(zip(pass_keys, rows_of_pass)):
        groups = by_pass[key]
        sizes = [f.size for _, f in groups]
        shape = PassShape(path=key[0], slab=key[1], rows=rows, groups=bucket_n(len(groups)),
                          max_group=bucket_n(max(len(g.members) for g, _ in groups)),
                          max_prefix=bucket_l(max(sizes)), mean_prefix=bucket_l(_mean(sizes)))
        passes.append(shape)
        small.append(_ptr([len(g.members) for g, _ in groups], shape.groups))
        if key[1]:
            small += [_pad([f.start for _, f in groups], shape.groups), _pad(sizes, shape.groups)]
        else:
            small.append(_ptr(sizes, shape.groups))
            big[f"pass{n}"] = _cat([f.ids for _, f in groups]).astype(np.int32)
    suffix_lens: list[int] = []  # per grouped row, pads included (and so the table's bases)
    suffix_rows: list[int] = []
    suffix_where: list[int] = []  # each member's grouped row
    at = 0  # into suffix_of, one a member
    for ms, rows in zip(pass_members, rows_of_pass):
        suffix_where += range(len(suffix_lens), len(suffix_lens) + len(ms))
        suffix_lens += suffix_of[at: at + len(ms)] + [0] * (rows - len(ms))
        if table is not None:
            suffix_rows += suffix_bases[at: at + len(ms)] + [PAD_ENTRY] * (rows - len(ms))
        at += len(ms)
    if table is None:
        small.append(_ptr(suffix_lens, sum(rows_of_pass)))
        big["suffix"] = suffix_ids
    else:
        small += [_pad(suffix_rows, len(suffix_rows) + 1), np.array(suffix_lens, np.int32)]
        suffix_at = len(small) - 1
        patch = rows_of_table.patches(num_slots)
        if patch is None:
            return _reference(plan, num_slots, pad, table)  # raises, naming the first bad id
        if patch[0].size:
            big["tdst"], big["tids"] = patch

    # per-row inputs; pads: token 0 at position 0, K/V to the scratch slot `num_slots`; request n of a region
    # samples row (region's first sample) + n
    counts = [n_ext, n_dec, *map(len, pass_members)]
    region_rows = [ext_rows, dec_rows, *rows_of_pass]
    num_rows = sum(region_rows)
    toks = _cat([r.input_tokens for r in rq])
    ctx = np.fromiter([r.context_len for r in rq], np.int64, len(rq))
    T = sum(nn)
    if nn.count(1) == len(nn):  # one new token a request (decode steps)
        pos = ctx
    else:
        n_arr = np.array(nn, np.int64)
        pos = np.repeat(ctx - (np.cumsum(n_arr) - n_arr), n_arr) + np.arange(T)
    if toks.size != T or new.size != T:
        return _reference(plan, num_slots, pad, table)  # inputs that do not match num_new: as the reference lays them
    tokens = np.zeros(num_rows, np.int32)
    positions = np.zeros(num_rows, np.int32)
    new_slots = np.full(num_rows, num_slots, np.int32)
    fields = [(tokens, toks), (positions, pos), (new_slots, new)]
    if table is not None:  # the table entry each row's new token goes to: base + (position - start) // page
        n_ext_tok, rest = sum(ext_sizes), np.array(nn[n_ext:], np.int64)
        bases = np.repeat(np.array(dec_bases + suffix_bases, np.int64), rest)
        starts = np.repeat(np.array([0] * n_dec + suffix_starts, np.int64), rest)
        app = np.concatenate([np.full(n_ext_tok, PAD_ENTRY), bases + (pos[n_ext_tok:] - starts) // table.page])
        append = np.full(num_rows, PAD_ENTRY, np.int32)
        fields.append((append, app))
    samples: list[int] = []
    row = at = req = 0
    sample_row = ext_reqs + dec_rows
    for n, (count, rows) in enumerate(zip(counts, region_rows)):
        used = sum(nn[req: req + count])
        if used > rows:
            return _reference(plan, num_slots, pad, table)  # more rows than the bucket: as the reference lays them
        if used:
            for out, src in fields:
                out[row: row + used] = src[at: at + used]
        first = (0, ext_reqs)[n] if n < 2 else sample_row
        samples += range(first, first + count)
        if n >= 2:
            sample_row += rows
        row, at, req = row + rows, at + used, req + count
    sample_of = dict(zip([r.rid for r in rq], samples))

    shape = StepShape(
        page_size=ps, ext_rows=ext_rows, ext_reqs=ext_reqs, ext_max_qo=bucket_n(max(ext_sizes, default=0)),
        dec_rows=dec_rows, dec_max_kv=bucket_l(max(dec_lens, default=0)), dec_mean_kv=bucket_l(_mean(dec_lens)),
        passes=tuple(passes), suffix_max_kv=bucket_l(max(suffix_lens, default=0)),
        suffix_mean_kv=bucket_l(_mean(dict(zip(members, suffix_of)).values())),  # over requests
        table=table is not None)
    # sampled rows: each extend request's last row, then every other row
    last = _pad(small[0][1: n_ext + 1] - 1, ext_reqs)
    sample = np.concatenate([last, np.arange(ext_rows, num_rows, dtype=np.int32)])
    head = [tokens, positions, new_slots, sample]
    if table is not None:
        head.append(append)
        table.finish()
    host = HostStep(shape, head + small, {k: v.astype(np.int32, copy=False) for k, v in big.items()}, sample_of,
                    table.end if table is not None else 0)
    if table is not None and not n_ext and nn.count(1) == len(nn):  # a decode step: the next one may repeat it
        first_grouped = dec_rows + np.array(suffix_where, np.int64)
        table.repeat = Repeat(
            key=repeat_key(plan), pad=pad,
            host=replace(host, big={k: v for k, v in host.big.items() if k not in ("tdst", "tids")}),
            order=[*dec, *members], rows=[table.row(r.rid) for r in rq],
            bases=np.array(dec_bases + suffix_bases, np.int64), starts=np.array([0] * n_dec + suffix_starts, np.int64),
            step_rows=np.concatenate([np.arange(n_dec), first_grouped]),
            lens_at=(len(head) + dec_at, len(head) + suffix_at),
            lens_rows=(np.arange(n_dec), np.array(suffix_where, np.int64)), page=table.page, bucket_len=bucket_l)
    return host
