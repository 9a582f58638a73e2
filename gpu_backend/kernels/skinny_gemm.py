"""Decode-sized linear layers: y = x @ W^T for few rows (M <= 128), split over K.

A decode step's GEMMs read every weight once for a handful of rows, so they are bound by the
weights' bytes; cuBLAS reaches about 2.7 TB/s there on the H200 (the kernel issue), against
4.3 TB/s of copy bandwidth. This kernel streams W in [BLOCK_K, BLOCK_N] tiles, one program per
(BLOCK_N columns, K split), all M rows at once (one row tile), so that a narrow output (o_proj,
down_proj: N = hidden) still gives every SM several programs. Each split writes an fp32 partial
sum; `skinny_linear` adds the splits in K order and casts (one split: the partial is the result).

    y = skinny_linear(x, w, bias=None, splits=None)   # x [M, K], w [N, K] (torch.nn.functional.linear's layout)

Not wired into the engine: `gpu_backend.bench.skinny_gemm` times it against torch.matmul at the
engine's shapes first (kernel + reference + odd-shape tests + benchmark, as the other kernels).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import cdiv, next_pow2

MAX_ROWS = 128


@triton.jit
def _skinny_kernel(X, W, P, M, N, K, K_SPLIT,
                   stride_xm, stride_xk, stride_wn, stride_wk, stride_ps, stride_pm,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_hi
        x = tl.load(X + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=(offs_m < M)[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=(offs_n < N)[None, :] & k_ok[:, None], other=0.0)
        acc += tl.dot(x, w)
    tl.store(P + split * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :], acc,
             mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def default_splits(n: int, k: int, block_n: int, block_k: int, sms: int = 132) -> int:
    """K splits so that the grid has about two programs per SM (at most one per BLOCK_K of K)."""
    cols = cdiv(n, block_n)
    return max(1, min(cdiv(k, block_k), cdiv(2 * sms, cols)))


def skinny_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, splits: int | None = None,
                  block_n: int = 64, block_k: int = 128, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T (+ bias [N]) for M <= MAX_ROWS, in x's dtype; fp32 accumulation."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x must be [M, K] and w [N, K] with the same K, got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"x and w must share dtype and device, got {x.dtype}/{x.device} and {w.dtype}/{w.device}")
    M, K = x.shape
    N = w.shape[0]
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"skinny_linear takes 1..{MAX_ROWS} rows, got {M}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias must be [{N}], got {tuple(bias.shape)}")
    if splits is None:
        splits = default_splits(N, K, block_n, block_k,
                                torch.cuda.get_device_properties(x.device).multi_processor_count
                                if x.is_cuda else 132)
    if not 1 <= splits <= cdiv(K, 16):
        raise ValueError(f"splits must be 1..{cdiv(K, 16)} for K = {K}, got {splits}")
    k_split = cdiv(cdiv(K, splits), 16) * 16  # every split but the last a whole number of 16-wide K steps
    splits = cdiv(K, k_split)
    part = torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
    block_m = max(16, next_pow2(M))
    _skinny_kernel[(cdiv(N, block_n), splits)](
        x, w, part, M, N, K, k_split, x.stride(0), x.stride(1), w.stride(0), w.stride(1), part.stride(0),
        part.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
        num_stages=num_stages)
    y = part[0] if splits == 1 else part.sum(0)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
