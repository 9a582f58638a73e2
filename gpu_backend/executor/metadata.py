"""Device metadata of one step: the launch arguments of every attention region, as views of
the metadata arena, plus the host integers (from the step's `StepShape`) that size the grids.

Storage follows the plan: page tables for the `paged` policy's extend and decode reads, slabs for
prefix groups whose prefix is one HOT run, slot lists otherwise.
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
    suffix_kv: L.SlotLists


MEMO_SHAPES = 512  # shapes whose StepMeta an arena keeps (eager steps' exact shapes vary without bound)


def upload(host: R.HostStep, arena: MetaArena) -> StepMeta:
    """The step's metadata copied into the arena (`rows.build` made `host` from the plan), and the views of it that
    the launches read (made once per shape and arena generation: the same for every step of that shape)."""
    arena.upload(host)
    meta = arena.memo.get(host.shape)
    if meta is None:
        if len(arena.memo) >= MEMO_SHAPES:
            arena.memo.clear()
        meta = arena.memo[host.shape] = _views(host, arena)
    return meta


def _views(host: R.HostStep, arena: MetaArena) -> StepMeta:
    s = host.shape
    it = iter(arena.views(host))
    tokens, positions, new_slots, sample = next(it), next(it), next(it), next(it)
    ext_ptr = next(it)

    def storage(name: str) -> L.KVLayout:  # rows._storage's fields, in its order
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
    suffix = L.SlotLists(next(it), arena.buffer("suffix"))
    return StepMeta(s, tokens, positions, new_slots, sample, ext_ptr, ext_prefix, decode_kv, passes, suffix)
