"""Where a sequence's K/V rows live: the three storages every attention launcher accepts.

A *slot* is one token's row in the per-layer KV buffers `k_cache`/`v_cache`
`[num_slots, n_kv_heads, head_dim]` (the same slot index in every layer). A launcher is
handed one of these descriptions per sequence (request, or prefix group):

- `SlotLists(indptr, indices)` — page size 1. CSR: sequence i owns the slots
  `indices[indptr[i]:indptr[i+1]]`, in token order.
- `PageTable(indptr, indices, lens, page_size)` — page size N. Sequence i owns the pages
  `indices[indptr[i]:indptr[i+1]]`; token p sits in slot `page * N + p % N` of page
  `indices[indptr[i] + p // N]`; `lens[i]` tokens are valid. The kernels read only `indptr[i]`
  and `lens[i]` (the engine's request table relies on it: rows anywhere in one shared `indices`).
- `Slabs(start, length)` — a HOT slab: sequence i owns slots `start[i] .. start[i]+length[i]-1`.

All arrays are int32 on the KV buffers' device. `validate` checks every id against
`num_slots` on the host (one synchronisation) and raises `ValueError` naming the
argument and the bad value; launchers call it before any launch unless `check=False`
(required inside CUDA-graph capture, where host reads are illegal).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SlotLists:
    indptr: torch.Tensor   # [n+1] int32
    indices: torch.Tensor  # [nnz] int32 slot ids


@dataclass(frozen=True, slots=True)
class PageTable:
    indptr: torch.Tensor   # [n+1] int32 into indices
    indices: torch.Tensor  # [n_pages_used] int32 page ids
    lens: torch.Tensor     # [n] int32 valid tokens per sequence
    page_size: int


@dataclass(frozen=True, slots=True)
class Slabs:
    start: torch.Tensor    # [n] int32 first slot
    length: torch.Tensor   # [n] int32 tokens


KVLayout = SlotLists | PageTable | Slabs

# Kernel-side encoding: MODE constexpr and the three pointer arguments (A, B, C).
MODE_SLOTS, MODE_PAGES, MODE_SLAB = 0, 1, 2


def num_seqs(kv: KVLayout) -> int:
    if isinstance(kv, Slabs):
        return kv.start.shape[0]
    return kv.indptr.shape[0] - 1


def kernel_args(kv: KVLayout):
    """(MODE, ptr_a, ptr_b, ptr_c, PAGE) as the kernels read them (see kernels/common.py)."""
    if isinstance(kv, SlotLists):
        return MODE_SLOTS, kv.indptr, kv.indices, kv.indptr, 1
    if isinstance(kv, PageTable):
        return MODE_PAGES, kv.indptr, kv.indices, kv.lens, kv.page_size
    if isinstance(kv, Slabs):
        return MODE_SLAB, kv.start, kv.start, kv.length, 1
    raise TypeError(f"kv must be SlotLists, PageTable or Slabs, got {type(kv).__name__}")


def _int32_vec(name: str, t, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


def _first_bad(name: str, t: torch.Tensor, bad: torch.Tensor, what: str) -> None:
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name}[{i}] = {int(t[i])} {what}")


def check_indptr(name: str, indptr: torch.Tensor, n: int | None, total: int | None, device) -> None:
    """indptr: int32 [n+1], starts at 0, non-decreasing, ends at `total` (when given)."""
    _int32_vec(name, indptr, device)
    if n is not None and indptr.shape[0] != n + 1:
        raise ValueError(f"{name} must have {n + 1} entries, got {indptr.shape[0]}")
    if indptr.shape[0] == 0:
        raise ValueError(f"{name} must have at least one entry")
    h = indptr.cpu()
    if int(h[0]) != 0:
        raise ValueError(f"{name}[0] = {int(h[0])}, must be 0")
    _first_bad(name, h, torch.cat([torch.zeros(1, dtype=torch.bool), h[1:] < h[:-1]]),
               "is smaller than the entry before it (must be non-decreasing)")
    if total is not None and int(h[-1]) != total:
        raise ValueError(f"{name}[-1] = {int(h[-1])}, must equal {total}")


def validate(kv: KVLayout, *, n: int, num_slots: int, device, name: str = "kv") -> None:
    """Check `kv` describes `n` sequences whose every slot lies in [0, num_slots)."""
    if isinstance(kv, SlotLists):
        _int32_vec(f"{name}.indices", kv.indices, device)
        check_indptr(f"{name}.indptr", kv.indptr, n, kv.indices.shape[0], device)
        idx = kv.indices.cpu()
        _first_bad(f"{name}.indices", idx, (idx < 0) | (idx >= num_slots),
                   f"is not a slot id in [0, num_slots={num_slots})")
    elif isinstance(kv, PageTable):
        ps = kv.page_size
        if not isinstance(ps, int) or ps < 1:
            raise ValueError(f"{name}.page_size must be a positive int, got {ps!r}")
        _int32_vec(f"{name}.indices", kv.indices, device)
        _int32_vec(f"{name}.lens", kv.lens, device)
        if kv.lens.shape[0] != n:
            raise ValueError(f"{name}.lens must have {n} entries, got {kv.lens.shape[0]}")
        check_indptr(f"{name}.indptr", kv.indptr, n, kv.indices.shape[0], device)
        n_pages = num_slots // ps
        idx = kv.indices.cpu()
        _first_bad(f"{name}.indices", idx, (idx < 0) | (idx >= n_pages),
                   f"is not a page id in [0, num_slots // page_size = {n_pages})")
        lens = kv.lens.cpu().long()
        ptr = kv.indptr.cpu().long()
        cap = (ptr[1:] - ptr[:-1]) * ps
        _first_bad(f"{name}.lens", lens, (lens < 0) | (lens > cap),
                   f"is negative or exceeds its pages' capacity ({name}.indptr gives pages x {ps})")
    elif isinstance(kv, Slabs):
        _int32_vec(f"{name}.start", kv.start, device)
        _int32_vec(f"{name}.length", kv.length, device)
        if kv.start.shape[0] != n or kv.length.shape[0] != n:
            raise ValueError(f"{name}.start/{name}.length must have {n} entries, got "
                             f"{kv.start.shape[0]}/{kv.length.shape[0]}")
        st, ln = kv.start.cpu().long(), kv.length.cpu().long()
        _first_bad(f"{name}.start", st, st < 0, "is negative")
        _first_bad(f"{name}.length", ln, ln < 0, "is negative")
        _first_bad(f"{name}.start", st, st + ln > num_slots,
                   f"+ its length runs past num_slots={num_slots}")
    else:
        raise TypeError(f"{name} must be SlotLists, PageTable or Slabs, got {type(kv).__name__}")


def length_stats(kv: KVLayout) -> tuple[int, int]:
    """(longest, mean rounded up) sequence length in tokens, read on the host: one synchronisation."""
    if isinstance(kv, SlotLists):
        p = kv.indptr.cpu().long()
        ln = p[1:] - p[:-1]
    else:
        ln = (kv.lens if isinstance(kv, PageTable) else kv.length).cpu().long()
    if not ln.shape[0]:
        return 0, 0
    return int(ln.max()), -(-int(ln.sum()) // ln.shape[0])
