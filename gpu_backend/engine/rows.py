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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from granisim.plan import BatchPlan

PASS_ORDER = (("cascade", False), ("cascade", True), ("dense", True))  # (path, prefix is one slab)


def bucket(n: int) -> int:
    """Row/sequence counts: steps of a quarter of the enclosing power of two (exact to 4; < 50% pad)."""
    if n <= 0:
        return 0
    p = 1 << (n - 1).bit_length()
    step = max(1, p // 4)
    return -(-n // step) * step


def bucket_len(n: int) -> int:
    """Longest-sequence bounds (split planning only): steps of 256 tokens or an eighth power of two (< 25% pad)."""
    if n <= 0:
        return 0
    step = max(256, (1 << (n - 1).bit_length()) // 8)
    return -(-n // step) * step


@dataclass(frozen=True)
class PassShape:
    path: str
    slab: bool
    rows: int  # padded member rows
    groups: int  # padded group count
    max_group: int
    max_prefix: int


@dataclass(frozen=True)
class StepShape:
    """Everything a step's launches are sized by: equal shapes -> one CUDA graph."""

    page_size: int  # decode storage: page table of this size, or slot lists when 0
    ext_rows: int
    ext_reqs: int
    ext_max_qo: int
    dec_rows: int
    dec_max_kv: int
    passes: tuple[PassShape, ...]
    suffix_max_kv: int

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


def build(plan: BatchPlan, num_slots: int) -> HostStep:
    """Row regions, padded metadata and shape of one plan; ValueError before any launch on a bad id."""
    reqs = plan.requests
    for r in reqs:
        if r.layout is None or r.layout.num_tokens != r.kv_len:
            raise ValueError(f"plan step {plan.step}: request {r.rid} has no layout for {r.kv_len} tokens")
    grouped = {i: g for g in plan.groups if g.path in ("cascade", "dense") for i in g.members}
    ext = [i for i, r in enumerate(reqs) if r.is_prefill]
    dec = [i for i, r in enumerate(reqs) if not r.is_prefill and i not in grouped]
    for i in ext + dec + list(grouped):
        s = reqs[i].new_slots
        if len(s) and (min(s) < 0 or max(s) >= num_slots):
            bad = next(x for x in s if x < 0 or x >= num_slots)
            raise ValueError(f"plan step {plan.step}: KV write to slot {int(bad)} outside the buffer of {num_slots}")
    slots = {}
    for i in ext + dec + list(grouped):
        s = reqs[i].layout.slots()
        if s.size and (s.min() < 0 or s.max() >= num_slots):
            bad = s[(s < 0) | (s >= num_slots)][0]
            raise ValueError(f"plan step {plan.step}: request {reqs[i].rid} reads slot {int(bad)} outside the "
                             f"buffer of {num_slots}")
        slots[i] = s

    row_reqs: list[int] = []  # plan index of each real row's request, region after region (pads: -1)
    small: list[np.ndarray] = []
    big: dict[str, np.ndarray] = {}

    def region(idx: list[int], n_rows: int) -> None:
        rows = [i for i in idx for _ in range(reqs[i].num_new)]
        row_reqs.extend(rows + [-1] * (n_rows - len(rows)))

    # extend: prefill chunks over their cached prefix (slot lists)
    ext_sizes = [reqs[i].num_new for i in ext]
    ext_rows, ext_reqs = bucket(sum(ext_sizes)), bucket(len(ext))
    region(ext, ext_rows)
    ext_prefix = [slots[i][: reqs[i].context_len] for i in ext]
    small += [_csr_ptr(ext_sizes, ext_reqs), _csr_ptr([p.size for p in ext_prefix], ext_reqs)]
    big["ext"] = _cat(ext_prefix)
    # decode: every request outside a prefix pass reads its whole context
    dec_rows = bucket(len(dec))
    region(dec, dec_rows)
    dec_kv = [slots[i] for i in dec]
    if plan.policy == "paged":
        ps = plan.page_size
        small += [_csr_ptr([-(-s.size // ps) for s in dec_kv], dec_rows), _pad([s.size for s in dec_kv], dec_rows, 0)]
        big["dec"] = _cat([s[::ps] // ps for s in dec_kv])
    else:
        ps = 0
        small.append(_csr_ptr([s.size for s in dec_kv], dec_rows))
        big["dec"] = _cat(dec_kv)
    # prefix passes: one launch per (path, storage), groups stacked; then one suffix pass over all
    by_pass: dict[tuple[str, bool], list] = {}
    for g in plan.groups:
        if g.path not in ("cascade", "dense"):
            continue
        first = slots[g.members[0]][: g.prefix_len]
        slab = bool(first.size) and bool((np.diff(first) == 1).all())
        if g.path == "dense" and not slab:
            raise ValueError(f"plan step {plan.step}: dense group {g.key} is not one contiguous slab")
        by_pass.setdefault((g.path, slab), []).append((g, first))
    passes, suffix = [], []
    for n, key in enumerate(k for k in PASS_ORDER if k in by_pass):
        groups = by_pass[key]
        members = [i for g, _ in groups for i in g.members]
        shape = PassShape(path=key[0], slab=key[1], rows=bucket(len(members)), groups=bucket(len(groups)),
                          max_group=bucket(max(len(g.members) for g, _ in groups)),
                          max_prefix=bucket_len(max(f.size for _, f in groups)))
        passes.append(shape)
        region(members, shape.rows)
        small.append(_csr_ptr([len(g.members) for g, _ in groups], shape.groups))
        firsts = [f for _, f in groups]
        if key[1]:
            small += [_pad([f[0] for f in firsts], shape.groups, 0), _pad([f.size for f in firsts], shape.groups, 0)]
        else:
            small.append(_csr_ptr([f.size for f in firsts], shape.groups))
            big[f"pass{n}"] = _cat(firsts)
        suffix += [slots[i][g.prefix_len:] for g, _ in groups for i in g.members]
        suffix += [np.empty(0, np.int64)] * (shape.rows - len(members))
    grouped_rows = sum(p.rows for p in passes)
    small.append(_csr_ptr([s.size for s in suffix], grouped_rows))
    big["suffix"] = _cat(suffix)

    shape = StepShape(
        page_size=ps, ext_rows=ext_rows, ext_reqs=ext_reqs, ext_max_qo=bucket(max(ext_sizes, default=0)),
        dec_rows=dec_rows, dec_max_kv=bucket_len(max((s.size for s in dec_kv), default=0)),
        passes=tuple(passes), suffix_max_kv=bucket_len(max((s.size for s in suffix), default=0)))
    # per-row inputs (pads: token 0 at position 0, K/V written to the scratch slot `num_slots`)
    tokens, positions, new_slots = (np.zeros(shape.num_rows, np.int64) for _ in range(3))
    new_slots[:] = num_slots
    cursor: dict[int, int] = {}
    for row, i in enumerate(row_reqs):
        if i < 0:
            continue
        j = cursor.get(i, 0)
        cursor[i] = j + 1
        r = reqs[i]
        tokens[row], positions[row], new_slots[row] = r.input_tokens[j], r.context_len + j, r.new_slots[j]
    # sampled rows: each extend request's last row, then all other rows
    ext_ptr = small[0]
    last = _pad(ext_ptr[1: len(ext) + 1] - 1, ext_reqs, 0)
    sample = np.concatenate([last, np.arange(ext_rows, shape.num_rows)])
    sample_of = {reqs[i].rid: n for n, i in enumerate(ext)}
    for row in range(ext_rows, shape.num_rows):
        if row_reqs[row] >= 0:
            sample_of[reqs[row_reqs[row]].rid] = ext_reqs + row - ext_rows
    small = [tokens, positions, new_slots, sample] + small
    return HostStep(shape, [a.astype(np.int32) for a in small], {k: v.astype(np.int32) for k, v in big.items()},
                    sample_of)
