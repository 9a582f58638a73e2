"""Helpers for the gpu_backend tests: devices, tolerances, storages holding the same tokens."""
from __future__ import annotations

import torch

from gpu_backend.kernels import layout as L

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")

# Max |kernel - float64 reference| allowed, per dtype (outputs are weighted means of N(0,1) V rows,
# |o| <~ 1). fp32 on CPU: the interpreter does exact fp32 dots; on GPU fp32 dots are tf32, whose inputs
# keep fp16's 10 mantissa bits, so fp16's output bound (on an H200 the fp32 cases reach 2.1-2.5e-3).
# fp16 / bf16: P is rounded to the input dtype before the PV product and o to the output dtype.
O_TOL = {torch.float32: 4e-3 if CUDA else 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
LSE_TOL = {torch.float32: 4e-3 if CUDA else 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}

STORAGES = ("slots", "pages1", "pages16", "slab")


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def close(o, lse, ref_o, ref_lse, dtype, what=""):
    """Assert o/lse match the reference: -inf exactly where the reference has no keys."""
    o, lse = o.cpu().double(), lse.cpu().double()
    assert not torch.isnan(o).any(), f"{what}: NaN in o (unwritten or bad maths)"
    assert not torch.isnan(lse).any(), f"{what}: NaN in lse"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty), f"{what}: lse -inf pattern differs"
    assert (lse[empty] < 0).all()
    assert (o[empty] == 0).all(), f"{what}: rows with no keys must give o = 0"
    if (~empty).any():
        err_o = (o - ref_o).abs().max().item()
        err_l = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert err_o <= O_TOL[dtype], f"{what}: max |o - ref| = {err_o:.3g} > {O_TOL[dtype]}"
        assert err_l <= LSE_TOL[dtype], f"{what}: max |lse - ref| = {err_l:.3g} > {LSE_TOL[dtype]}"


def caches(num_slots, n_kv, d, dtype, gen):
    k = torch.randn(num_slots, n_kv, d, generator=gen).to(dtype)
    v = torch.randn(num_slots, n_kv, d, generator=gen).to(dtype)
    return k.to(DEV), v.to(DEV)


def i32(x):
    return torch.as_tensor(x, dtype=torch.int32).to(DEV)


def place(kind: str, lens: list[int], num_slots: int, gen) -> tuple[L.KVLayout, list[torch.Tensor]]:
    """A layout of `kind` for sequences of `lens` tokens, at random disjoint places in
    [0, num_slots); also each sequence's slot ids (token order)."""
    if kind == "slots":
        perm = torch.randperm(num_slots, generator=gen)
        assert sum(lens) <= num_slots
        seqs, at = [], 0
        for n in lens:
            seqs.append(perm[at:at + n])
            at += n
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + n)
        idx = torch.cat(seqs) if seqs else torch.empty(0, dtype=torch.long)
        return L.SlotLists(i32(indptr), i32(idx)), seqs
    if kind.startswith("pages"):
        ps = int(kind[5:])
        n_pages = num_slots // ps
        need = [-(-n // ps) for n in lens]
        assert sum(need) <= n_pages
        perm = torch.randperm(n_pages, generator=gen)
        pages, seqs, indptr, at = [], [], [0], 0
        for n, p in zip(lens, need):
            pg = perm[at:at + p]
            at += p
            pages.append(pg)
            indptr.append(indptr[-1] + p)
            pos = torch.arange(n)
            seqs.append(pg[pos // ps] * ps + pos % ps)
        idx = torch.cat(pages) if pages else torch.empty(0, dtype=torch.long)
        return L.PageTable(i32(indptr), i32(idx), i32(lens), ps), seqs
    if kind == "slab":
        free = num_slots - sum(lens)
        assert free >= 0
        cuts = sorted(torch.randint(0, free + 1, (len(lens),), generator=gen).tolist())
        order = torch.randperm(len(lens), generator=gen).tolist()  # slabs not in sequence order
        starts, at, prev = [0] * len(lens), 0, 0
        for c, i in zip(cuts, order):
            at += c - prev
            prev = c
            starts[i] = at
            at += lens[i]
        seqs = [torch.arange(s, s + n) for s, n in zip(starts, lens)]
        return L.Slabs(i32(starts), i32(lens)), seqs
    raise ValueError(kind)


def fill(k_cache, v_cache, seqs, k_tok, v_tok):
    """Write logical token K/V rows (list per sequence, [n, n_kv, d]) into their slots."""
    for sl, kt, vt in zip(seqs, k_tok, v_tok):
        if sl.numel():
            k_cache[sl.to(DEV)] = kt.to(DEV)
            v_cache[sl.to(DEV)] = vt.to(DEV)


def room(kind: str, lens: list[int], extra: int = 40) -> int:
    """num_slots big enough for `lens` in `kind` (whole pages), plus some."""
    ps = int(kind[5:]) if kind.startswith("pages") else 1
    return (sum(-(-n // ps) for n in lens) + 3) * ps + extra


def tokens(lens, n_kv, d, dtype, seed):
    """Logical K/V rows of each sequence: list of [n, n_kv, d] (same for every storage)."""
    g = torch.Generator().manual_seed(seed)
    k = [torch.randn(n, n_kv, d, generator=g).to(dtype) for n in lens]
    v = [torch.randn(n, n_kv, d, generator=g).to(dtype) for n in lens]
    return k, v


def stored(kind, lens, n_kv, d, dtype, seed, extra=40):
    """(k_cache, v_cache, layout): the sequences of `tokens(lens, ..., seed)` held in `kind`
    at random places, the rest of the cache random (not zeros: garbage must not leak in)."""
    g = torch.Generator().manual_seed(seed * 7919 + STORAGES.index(kind) + 1)
    num_slots = room(kind, lens, extra)
    kc, vc = caches(num_slots, n_kv, d, dtype, g)
    kv, seqs = place(kind, lens, num_slots, g)
    k_tok, v_tok = tokens(lens, n_kv, d, dtype, seed)
    fill(kc, vc, seqs, k_tok, v_tok)
    return kc, vc, kv


def queries(t, n_q, d, dtype, seed):
    g = torch.Generator().manual_seed(seed + 12345)
    return torch.randn(t, n_q, d, generator=g).to(dtype).to(DEV)


def validate_on_cpu(tmp_path, scenario_toml: str):
    """`granisim validate SCENARIO --device cpu` on a scenario written from text: (out folder, validation.json
    as a dict, steps.parquet as a frame)."""
    import json

    import pandas as pd

    from granisim.cli import main

    sc = tmp_path / "scenario.toml"
    sc.write_text(scenario_toml)
    out = tmp_path / "val"
    assert main(["validate", str(sc), "--device", "cpu", "--out", str(out)]) == 0
    return out, json.loads((out / "validation.json").read_text()), pd.read_parquet(out / "steps.parquet")
