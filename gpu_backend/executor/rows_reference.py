"""The per-request construction of a step's host metadata that `rows.build` replaced: kept as its oracle.

`build_reference(plan, num_slots, pad)` returns what `rows.build` returns, byte for byte (the tests compare
them on recorded and random plans), and raises the same ValueError on a bad plan: `rows.build` checks every
id at once and, only when a check fails, runs this construction to name the first bad id in the order it
always has. `gpu_backend.bench.host_work` times both. It walks the plan request by request (a layout's
slots, a numpy array or two per request, range checks per array), which is what made it slow: 0.55 ms for a
decode step of 64 requests over 4 x 16K prefixes on the 2-core development machine.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from granisim.core.contract import BatchPlan

from .rows import PASS_ORDER, HostStep, PassShape, StepShape, _exact, _mean, bucket, bucket_len


def _csr_ptr(sizes, n_padded: int) -> np.ndarray:
    ptr = np.zeros(n_padded + 1, np.int64)
    ptr[1:len(sizes) + 1] = np.cumsum(sizes)
    ptr[len(sizes) + 1:] = ptr[len(sizes)]
    return ptr


def _cat(seqs) -> np.ndarray:
    return np.concatenate(seqs) if seqs else np.empty(0, np.int64)


def _pad(a, n: int, fill: int) -> np.ndarray:
    out = np.full(n, fill, np.int64)
    out[: len(a)] = a
    return out


def _storage(seqs: list[np.ndarray], n_padded: int, page_size: int, small: list[np.ndarray]) -> np.ndarray:
    """Sequences' slot ids as a page table (page_size > 0: page indptr and lengths appended to `small`,
    page ids returned; each sequence starts on a page boundary) or as slot lists (indptr appended, ids returned)."""
    if page_size:
        small += [_csr_ptr([-(-s.size // page_size) for s in seqs], n_padded), _pad([s.size for s in seqs], n_padded, 0)]
        return _cat([s[::page_size] // page_size for s in seqs])
    small.append(_csr_ptr([s.size for s in seqs], n_padded))
    return _cat(seqs)


class GroupPrefix(NamedTuple):
    """A group's shared prefix as its first member holds it: one slab (start, size) or listed slot ids."""

    slab: bool
    start: int
    size: int
    ids: np.ndarray | None  # None for a slab: no list to build (a 16K prefix is 16K ids per group per step)


def _group_prefix(layout, n: int, checked) -> GroupPrefix:
    """The first `n` tokens of `layout` (range-checked by `checked`) as a GroupPrefix."""
    seg = layout.segments[0] if layout.segments else None
    if n and seg is not None and seg.slab is not None and seg.slab[1] >= n:  # the allocator marked the run
        start = seg.slab[0]
        checked(np.array([start, start + n - 1]))
        return GroupPrefix(True, start, n, None)
    ids = checked(layout.slots()[:n])
    slab = bool(ids.size) and bool((np.diff(ids) == 1).all())
    return GroupPrefix(slab, int(ids[0]) if slab else 0, int(ids.size), ids)


def build_reference(plan: BatchPlan, num_slots: int, pad: bool = True) -> HostStep:
    """Row regions, metadata and shape of one plan, padded to buckets (`pad`, for graph replays) or
    exact (eager steps); ValueError before any launch on a bad id."""
    bucket_n, bucket_l = (bucket, bucket_len) if pad else (_exact, _exact)
    reqs = plan.requests
    for r in reqs:
        if r.layout is None or r.layout.num_tokens != r.kv_len:
            raise ValueError(f"plan step {plan.step}: request {r.rid} has no layout for {r.kv_len} tokens")
    grouped = {i: g for g in plan.groups if g.path in ("cascade", "dense") for i in g.members}
    ext = [i for i, r in enumerate(reqs) if r.is_prefill]
    dec = [i for i, r in enumerate(reqs) if not r.is_prefill and i not in grouped]
    writes = np.concatenate([r.new_slots for r in reqs]) if reqs else np.empty(0, np.int64)
    if writes.size and (writes.min() < 0 or writes.max() >= num_slots):
        bad = writes[(writes < 0) | (writes >= num_slots)][0]
        raise ValueError(f"plan step {plan.step}: KV write to slot {int(bad)} outside the buffer of {num_slots}")

    def checked(i: int, s: np.ndarray) -> np.ndarray:
        if s.size and (s.min() < 0 or s.max() >= num_slots):
            bad = s[(s < 0) | (s >= num_slots)][0]
            raise ValueError(f"plan step {plan.step}: request {reqs[i].rid} reads slot {int(bad)} outside the "
                             f"buffer of {num_slots}")
        return s

    # whole contexts for extend/decode rows; a grouped member reads its group's prefix (checked once,
    # from the first member) and its own suffix
    slots = {i: checked(i, reqs[i].layout.slots()) for i in ext + dec}
    suffix_of = {i: checked(i, reqs[i].layout.slots_from(g.prefix_len)) for i, g in grouped.items()}
    # per-row inputs, region after region (pads: token 0 at position 0, K/V to the scratch slot `num_slots`)
    tokens, positions, new_slots = [], [], []
    sample_of: dict[int, int] = {}
    small: list[np.ndarray] = []
    big: dict[str, np.ndarray] = {}

    def region(idx: list[int], n_rows: int, first_sample: int) -> None:
        """Append the rows of requests `idx` (+ pads); request n's logits are sampled row first_sample + n."""
        for n, i in enumerate(idx):
            r = reqs[i]
            tokens.append(np.asarray(r.input_tokens, np.int64))
            positions.append(r.context_len + np.arange(r.num_new))
            new_slots.append(np.asarray(r.new_slots, np.int64))
            sample_of[r.rid] = first_sample + n
        pad = n_rows - sum(reqs[i].num_new for i in idx)
        tokens.append(np.zeros(pad, np.int64))
        positions.append(np.zeros(pad, np.int64))
        new_slots.append(np.full(pad, num_slots, np.int64))

    # extend: prefill chunks over their cached prefix (slot lists)
    ext_sizes = [reqs[i].num_new for i in ext]
    ext_rows, ext_reqs = bucket_n(sum(ext_sizes)), bucket_n(len(ext))
    region(ext, ext_rows, 0)
    # the `paged` policy's own contexts are read through its page table, as vLLM's kernels read them
    ps = plan.page_size if plan.policy == "paged" else 0
    ext_prefix = [slots[i][: reqs[i].context_len] for i in ext]
    small.append(_csr_ptr(ext_sizes, ext_reqs))
    big["ext"] = _storage(ext_prefix, ext_reqs, ps, small)
    # decode: every request outside a prefix pass reads its whole context
    dec_rows = bucket_n(len(dec))
    region(dec, dec_rows, ext_reqs)
    dec_kv = [slots[i] for i in dec]
    big["dec"] = _storage(dec_kv, dec_rows, ps, small)
    # prefix passes: one launch per (path, storage), groups stacked; then one suffix pass over all
    by_pass: dict[tuple[str, bool], list] = {}
    for g in plan.groups:
        if g.path not in ("cascade", "dense"):
            continue
        i0 = g.members[0]
        first = _group_prefix(reqs[i0].layout, g.prefix_len, lambda s: checked(i0, s))
        if g.path == "dense" and not first.slab:
            raise ValueError(f"plan step {plan.step}: dense group {g.key} is not one contiguous slab")
        by_pass.setdefault((g.path, first.slab), []).append((g, first))
    passes, suffix = [], []
    next_sample = ext_reqs + dec_rows
    for n, key in enumerate(k for k in PASS_ORDER if k in by_pass):
        groups = by_pass[key]
        members = [i for g, _ in groups for i in g.members]
        shape = PassShape(path=key[0], slab=key[1], rows=bucket_n(len(members)), groups=bucket_n(len(groups)),
                          max_group=bucket_n(max(len(g.members) for g, _ in groups)),
                          max_prefix=bucket_l(max(f.size for _, f in groups)),
                          mean_prefix=bucket_l(_mean(f.size for _, f in groups)))
        passes.append(shape)
        region(members, shape.rows, next_sample)
        next_sample += shape.rows
        small.append(_csr_ptr([len(g.members) for g, _ in groups], shape.groups))
        firsts = [f for _, f in groups]
        if key[1]:
            small += [_pad([f.start for f in firsts], shape.groups, 0), _pad([f.size for f in firsts], shape.groups, 0)]
        else:
            small.append(_csr_ptr([f.size for f in firsts], shape.groups))
            big[f"pass{n}"] = _cat([f.ids for f in firsts])
        suffix += [suffix_of[i] for g, _ in groups for i in g.members]
        suffix += [np.empty(0, np.int64)] * (shape.rows - len(members))
    grouped_rows = sum(p.rows for p in passes)
    small.append(_csr_ptr([s.size for s in suffix], grouped_rows))
    big["suffix"] = _cat(suffix)

    shape = StepShape(
        page_size=ps, ext_rows=ext_rows, ext_reqs=ext_reqs, ext_max_qo=bucket_n(max(ext_sizes, default=0)),
        dec_rows=dec_rows, dec_max_kv=bucket_l(max((s.size for s in dec_kv), default=0)),
        dec_mean_kv=bucket_l(_mean(s.size for s in dec_kv)), passes=tuple(passes),
        suffix_max_kv=bucket_l(max((s.size for s in suffix), default=0)),
        suffix_mean_kv=bucket_l(_mean(s.size for s in suffix_of.values())))
    # sampled rows: each extend request's last row, then every other row
    last = _pad(small[0][1: len(ext) + 1] - 1, ext_reqs, 0)
    sample = np.concatenate([last, np.arange(ext_rows, shape.num_rows)])
    tokens, positions, new_slots = (np.concatenate(a) for a in (tokens, positions, new_slots))
    small = [tokens, positions, new_slots, sample] + small
    return HostStep(shape, [a.astype(np.int32) for a in small], {k: v.astype(np.int32) for k, v in big.items()},
                    sample_of)
