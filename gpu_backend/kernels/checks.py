"""Argument checks shared by the launchers: shapes, dtypes, devices. Errors name the argument."""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def tensor(name: str, t, *, dim: int, dtypes=FLOAT_DTYPES, device=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}, expected one of {list(dtypes)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")
    return t


def kv_cache(k_cache, v_cache) -> tuple[int, int, int]:
    """k_cache, v_cache: [num_slots, n_kv_heads, head_dim], same shape/dtype/device."""
    tensor("k_cache", k_cache, dim=3)
    tensor("v_cache", v_cache, dim=3, dtypes=(k_cache.dtype,), device=k_cache.device)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    num_slots, n_kv, d = k_cache.shape
    head_dim(d)
    return num_slots, n_kv, d


def head_dim(d: int) -> None:
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim = {d} is not supported (16, 32, 64, 128 or 256)")


def queries(name: str, q, *, n_kv: int, d: int, dtype, device) -> int:
    """q: [T, n_q, d] with n_q a multiple of n_kv; returns G = n_q // n_kv."""
    tensor(name, q, dim=3, dtypes=(dtype,), device=device)
    if q.shape[2] != d:
        raise ValueError(f"{name} head_dim {q.shape[2]} != KV head_dim {d}")
    if q.shape[1] % n_kv:
        raise ValueError(f"{name} has {q.shape[1]} heads, not a multiple of n_kv_heads={n_kv}")
    return q.shape[1] // n_kv


def out_tensor(name: str, t, shape, dtype, device) -> torch.Tensor:
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    tensor(name, t, dim=len(shape), dtypes=(dtype,), device=device)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t


_SMS: dict = {}


def num_sms(device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: keep grids small
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SMS:
        _SMS[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SMS[key]
