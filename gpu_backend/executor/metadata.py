"""Device metadata of one step: the launch arguments of every attention region, as views of
the metadata arena, plus the host integers (from the step's `StepShape`) that size the grids.

Storage follows the plan: page tables for the `paged` policy's extend and decode reads, slabs for
prefix groups whose prefix is one HOT run, slot lists otherwise; with a request table (request_table.py) the
decode and suffix reads are page tables over the table's rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import layout as L
from . import rows as R
from .arena import MetaArena


@dataclass
class PrefixPass:
    """One launch over several groups' shared prefixes (same path and storage kind)."""

    shape: R.PassShape
    row0: int  # first row of the pass in the step
    group_indptr: torch.Tensor
    prefix: L.KVLayout


@dataclass
class StepMeta:
    shape: R.StepShape
    tokens: torch.Tensor  # [T] token ids fed this step (pads: 0)
    positions: torch.Tensor  # [T] absolute positions
    new_slots: torch.Tensor  # [T] KV write targets (pads: the scratch slot)
    sample_rows: torch.Tensor  # rows whose logits are computed
    extend_indptr: torch.Tensor
    extend_prefix: L.KVLayout
    decode_kv: L.KVLayout
    passes: list[PrefixPass]
    suffix_kv: L.SlotLists | L.PageTable
    table: torch.Tensor | None = None  # the request table, when the step reads through it
    append_dst: torch.Tensor | None = None  # [T] the table entry of each row's new token
    table_page: int = 1  # tokens a table entry covers
    small_ids: int = 0  # ids of the fixed-size fields (arena.copy_small)


MEMO_SHAPES = 512  # shapes whose StepMeta an arena keeps (eager steps' exact shapes vary without bound)


def upload(host: R.HostStep, arena: MetaArena, small_later: bool = False) -> StepMeta:
    """The step's metadata copied into the arena (`rows.build` made `host` from the plan), and the views of it that
    the launches read (made once per shape and arena generation: the same for every step of that shape). Rows of
    the request table written whole this step are written here, before the step's launches. `small_later`: the
    fixed-size fields are staged only, for the step's graph to copy (`arena.copy_small(meta.small_ids)`)."""
    arena.upload(host, small_later)
    if "tids" in host.big:
        n = host.big["tids"].size
        arena.buffer("table").index_copy_(0, arena.buffer("tdst")[:n].long(), arena.buffer("tids")[:n])
    meta = arena.memo.get(host.shape)
    if meta is None:
        if len(arena.memo) >= MEMO_SHAPES:
            arena.memo.clear()
        meta = arena.memo[host.shape] = _views(host, arena)
    return meta


def append_new_tokens(m: StepMeta) -> None:
    """Each row's new token into its request's row of the table (pads: the unread entry 0), on the device: the
    step's first launch, before any attention reads the table."""
    new = m.new_slots // m.table_page if m.table_page > 1 else m.new_slots
    m.table.index_copy_(0, m.append_dst.long(), new)


def _views(host: R.HostStep, arena: MetaArena) -> StepMeta:
    s = host.shape
    it = iter(arena.views(host))
    tokens, positions, new_slots, sample = next(it), next(it), next(it), next(it)
    append = next(it) if s.table else None
    table = arena.buffer("table") if s.table else None
    ext_ptr = next(it)

    def storage(name: str) -> L.KVLayout:  # rows._storage's fields, in its order
        if table is not None and name != "ext":
            return L.PageTable(next(it), table, next(it), s.page_size or 1)
        if s.page_size:
            return L.PageTable(next(it), arena.buffer(name), next(it), s.page_size)
        return L.SlotLists(next(it), arena.buffer(name))

    ext_prefix, decode_kv = storage("ext"), storage("dec")
    passes, row0 = [], s.ext_rows + s.dec_rows
    for n, p in enumerate(s.passes):
        gptr = next(it)
        prefix = L.Slabs(next(it), next(it)) if p.slab else L.SlotLists(next(it), arena.buffer(f"pass{n}"))
        passes.append(PrefixPass(p, row0, gptr, prefix))
        row0 += p.rows
    suffix = storage("suffix") if table is not None else L.SlotLists(next(it), arena.buffer("suffix"))
    return StepMeta(s, tokens, positions, new_slots, sample, ext_ptr, ext_prefix, decode_kv, passes, suffix, table,
                    append, s.page_size or 1, host.small_ids)
