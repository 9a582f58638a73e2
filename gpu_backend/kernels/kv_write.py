"""KV write: scatter the new tokens' K/V rows `[T, n_kv, d]` into their slots of the caches."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks
from .grid import cdiv, next_pow2


@triton.jit
def _kv_write_kernel(
    K, V, KC, VC, SLOTS,              # K, V [T, HD] rows; KC, VC [num_slots, HD] rows; SLOTS [T] int32
    T, stride_k, stride_v, stride_kc, stride_vc,
    HD: tl.constexpr, HD_P2: tl.constexpr, BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok_t = t < T
    t = t.to(tl.int64)
    cols = tl.arange(0, HD_P2)
    ok = ok_t[:, None] & (cols[None, :] < HD)
    slot = tl.load(SLOTS + t, mask=ok_t, other=0).to(tl.int64)
    k = tl.load(K + t[:, None] * stride_k + cols[None, :], mask=ok)
    v = tl.load(V + t[:, None] * stride_v + cols[None, :], mask=ok)
    tl.store(KC + slot[:, None] * stride_kc + cols[None, :], k, mask=ok)
    tl.store(VC + slot[:, None] * stride_vc + cols[None, :], v, mask=ok)


def _rows(name: str, t: torch.Tensor) -> None:
    """[N, n_kv, d] whose per-token row of n_kv * d elements is contiguous."""
    if t.shape[0] and (t.stride(2) != 1 or t.stride(1) != t.shape[2]):
        raise ValueError(f"{name} must hold each token's [n_kv, d] row contiguously "
                         f"(strides {t.stride()})")


class KvWriteLaunch:
    """The write of `tokens` rows of `hd` = n_kv * d elements, sized once: call it per layer with
    (k_cache, v_cache, k, v, slots). No checks: `write_kv` checks."""

    def __init__(self, tokens: int, hd: int):
        hd_p2 = next_pow2(hd)
        block_t = max(1, 4096 // hd_p2)
        self.grid = (cdiv(tokens, block_t),)
        self.tokens = tokens
        self.consts = dict(HD=hd, HD_P2=hd_p2, BLOCK_T=block_t, num_warps=4)

    def __call__(self, k_cache, v_cache, k, v, slots) -> None:
        if self.tokens:
            _kv_write_kernel[self.grid](k, v, k_cache, v_cache, slots, self.tokens, k.stride(0), v.stride(0),
                                        k_cache.stride(0), v_cache.stride(0), **self.consts)


def write_kv(*, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor, check: bool = True) -> None:
    """k_cache[slots[t]] = k[t]; v_cache[slots[t]] = v[t]. k, v [T, n_kv, d] in the cache dtype.

    With check=True every slot id is checked in range and unique before the launch."""
    num_slots, n_kv, d = checks.kv_cache(k_cache, v_cache)
    dev = k_cache.device
    checks.tensor("k", k, dim=3, dtypes=(k_cache.dtype,), device=dev)
    checks.tensor("v", v, dim=3, dtypes=(k_cache.dtype,), device=dev)
    T = k.shape[0]
    if k.shape != (T, n_kv, d) or v.shape != (T, n_kv, d):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [T, {n_kv}, {d}]")
    checks.tensor("slots", slots, dim=1, dtypes=(torch.int32,), device=dev)
    if slots.shape[0] != T:
        raise ValueError(f"slots has {slots.shape[0]} entries, k has {T} tokens")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        _rows(name, t)
    if T == 0:
        return
    if check:
        s = slots.cpu()
        bad = (s < 0) | (s >= num_slots)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"slots[{i}] = {int(s[i])} is not a slot id in [0, num_slots={num_slots})")
        u, counts = torch.unique(s, return_counts=True)
        if bool((counts > 1).any()):
            raise ValueError(f"slots repeats slot id {int(u[counts > 1][0])}")
    KvWriteLaunch(T, n_kv * d)(k_cache, v_cache, k, v, slots)
