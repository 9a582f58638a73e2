"""Device metadata for one batch plan: which rows take which attention path, over which KV.

Built once per step on the host with numpy from the plan's layouts, moved to the device in
a few int32 tensors, and reused by every layer. Storage follows the plan: page tables for
the `paged` policy, slabs for dense/cascade groups whose prefix is one HOT run, slot lists
otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from granisim.plan import BatchPlan

from .. import layout as L


def _i32(a, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)


def _packed(seqs: list[np.ndarray], device) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR (indptr, indices) of a list of id arrays."""
    ptr = np.concatenate([[0], np.cumsum([s.size for s in seqs])])
    idx = np.concatenate(seqs) if seqs else np.empty(0, np.int64)
    return _i32(ptr, device), _i32(idx, device)


def _csr(seqs: list[np.ndarray], device) -> L.SlotLists:
    return L.SlotLists(*_packed(seqs, device))


def _pages(seqs: list[np.ndarray], page: int, device) -> L.PageTable:
    # page-aligned runs: the first slot of every page names the page
    ptr, idx = _packed([s[::page] // page for s in seqs], device)
    return L.PageTable(ptr, idx, _i32([s.size for s in seqs], device), page)


@dataclass
class PrefixPass:
    """One launch over several groups' shared prefixes (same path and storage kind)."""

    path: str  # 'cascade' | 'dense'
    rows: torch.Tensor  # token rows of the members' queries, group after group
    group_indptr: torch.Tensor
    prefix: L.KVLayout
    max_group: int
    max_prefix: int


@dataclass
class StepMeta:
    num_tokens: int
    tokens: torch.Tensor  # [T] int64 token ids fed this step
    positions: torch.Tensor  # [T] absolute positions
    new_slots: torch.Tensor  # [T] int32 KV write targets
    last_rows: torch.Tensor  # [n_requests] the row whose logits sample each request's next token
    extend_rows: torch.Tensor | None  # prefill chunk rows
    extend_indptr: torch.Tensor | None
    extend_prefix: L.SlotLists | None
    extend_max_qo: int
    decode_rows: torch.Tensor | None  # decode requests read whole contexts themselves
    decode_kv: L.KVLayout | None
    decode_max_kv: int
    prefix_passes: list[PrefixPass]
    grouped_rows: torch.Tensor | None  # all grouped members' rows, in prefix-pass order
    suffix_kv: L.SlotLists | None  # each grouped member's KV after its shared prefix
    suffix_max_kv: int


def build(plan: BatchPlan, device, num_slots: int) -> StepMeta:
    reqs = plan.requests
    sizes = np.array([r.num_new for r in reqs], np.int64)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    tokens = np.concatenate([r.input_tokens for r in reqs])
    positions = np.concatenate([r.context_len + np.arange(r.num_new) for r in reqs])
    slots = np.concatenate([r.new_slots for r in reqs])
    for r in reqs:
        if r.layout is None or r.layout.num_tokens != r.kv_len:
            raise ValueError(f"plan step {plan.step}: request {r.rid} has no layout for {r.kv_len} tokens")
    if slots.size and (slots.min() < 0 or slots.max() >= num_slots):
        bad = slots[(slots < 0) | (slots >= num_slots)][0]
        raise ValueError(f"plan step {plan.step}: KV write to slot {int(bad)} outside the buffer of {num_slots}")

    ext = [i for i, r in enumerate(reqs) if r.is_prefill]
    in_group = {i for g in plan.groups if g.path in ("cascade", "dense") for i in g.members}
    dec = [i for i, r in enumerate(reqs) if not r.is_prefill and i not in in_group]

    def rows(idx):
        return np.concatenate([np.arange(offs[i], offs[i + 1]) for i in idx]) if idx else np.empty(0, np.int64)

    all_slots = {i: reqs[i].layout.slots() for i in set(ext) | set(dec) | in_group}
    # every id is checked here, on the host, so the launches need no device reads (no syncs)
    for i, s in all_slots.items():
        if s.size and (s.min() < 0 or s.max() >= num_slots):
            bad = s[(s < 0) | (s >= num_slots)][0]
            raise ValueError(f"plan step {plan.step}: request {reqs[i].rid} reads slot {int(bad)} outside the "
                             f"buffer of {num_slots}")
    meta = StepMeta(
        num_tokens=int(offs[-1]), tokens=torch.from_numpy(tokens).to(device),
        positions=torch.from_numpy(positions).to(device), new_slots=_i32(slots, device),
        last_rows=torch.from_numpy(offs[1:] - 1).to(device),
        extend_rows=None, extend_indptr=None, extend_prefix=None, extend_max_qo=0,
        decode_rows=None, decode_kv=None, decode_max_kv=0, prefix_passes=[], grouped_rows=None,
        suffix_kv=None, suffix_max_kv=0)
    if ext:
        meta.extend_rows = torch.from_numpy(rows(ext)).to(device)
        meta.extend_indptr = _i32(np.concatenate([[0], np.cumsum(sizes[ext])]), device)
        meta.extend_prefix = _csr([all_slots[i][: reqs[i].context_len] for i in ext], device)
        meta.extend_max_qo = int(sizes[ext].max())
    if dec:
        seqs = [all_slots[i] for i in dec]
        meta.decode_rows = torch.from_numpy(rows(dec)).to(device)
        meta.decode_kv = _pages(seqs, plan.page_size, device) if plan.policy == "paged" else _csr(seqs, device)
        meta.decode_max_kv = max(s.size for s in seqs)
    # group prefixes: one launch per (path, storage kind); then one suffix pass for all members
    passes: dict[tuple[str, bool], list] = {}
    for g in plan.groups:
        if g.path not in ("cascade", "dense"):
            continue
        first = all_slots[g.members[0]][: g.prefix_len]
        slab = bool(first.size) and bool((np.diff(first) == 1).all())
        if g.path == "dense" and not slab:
            raise ValueError(f"plan step {plan.step}: dense group {g.key} is not one contiguous slab")
        passes.setdefault((g.path, slab), []).append((g, first))
    order, suffix = [], []
    for (path, slab), groups in passes.items():
        members = [i for g, _ in groups for i in g.members]
        order += members
        suffix += [all_slots[i][g.prefix_len:] for g, _ in groups for i in g.members]
        sizes_g = [len(g.members) for g, _ in groups]
        firsts = [f for _, f in groups]
        prefix = (L.Slabs(_i32([f[0] for f in firsts], device), _i32([f.size for f in firsts], device))
                  if slab else _csr(firsts, device))
        meta.prefix_passes.append(PrefixPass(
            path=path, rows=torch.from_numpy(rows(members)).to(device),
            group_indptr=_i32(np.concatenate([[0], np.cumsum(sizes_g)]), device), prefix=prefix,
            max_group=max(sizes_g), max_prefix=max(f.size for f in firsts)))
    if order:
        meta.grouped_rows = torch.from_numpy(rows(order)).to(device)
        meta.suffix_kv = _csr(suffix, device)
        meta.suffix_max_kv = max(x.size for x in suffix)
    return meta
