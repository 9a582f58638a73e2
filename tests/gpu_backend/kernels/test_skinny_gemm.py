"""Decode-sized linear layers split over K: the same result as x @ W^T at odd shapes and split counts."""
import pytest
import torch

from gb_util import CUDA, DEV
from gpu_backend.kernels.skinny_gemm import MAX_ROWS, default_splits, skinny_linear

DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if CUDA else [])  # tl.dot on bf16: GPU only
TOL = {torch.float32: 2e-3 if CUDA else 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # relative to max |y|


def operands(M, K, N, dtype, seed, bias=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).to(DEV)
    b = torch.randn(N, generator=g).to(dtype).to(DEV) if bias else None
    return x, w, b


def check(y, x, w, b, dtype):
    ref = x.double() @ w.double().T + (b.double() if b is not None else 0)
    assert y.dtype == dtype and tuple(y.shape) == tuple(ref.shape)
    err = (y.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
    assert err <= TOL[dtype], f"max |y - ref| / max |ref| = {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(1, 48, 5), (3, 200, 130), (17, 64, 64), (64, 336, 70)])
@pytest.mark.parametrize("splits", [1, 3, None])
def test_matches_reference(M, K, N, splits, dtype):
    x, w, _ = operands(M, K, N, dtype, seed=M + K)
    check(skinny_linear(x, w, splits=splits, block_n=32, block_k=32), x, w, None, dtype)


def test_bias_and_default_tiles():
    x, w, b = operands(5, 300, 90, torch.float16, seed=7, bias=True)
    check(skinny_linear(x, w, b), x, w, b, torch.float16)


def test_split_counts_fill_the_gpu_without_exceeding_k():
    assert default_splits(28672, 4096, 64, 128) == 1        # 448 column tiles: enough programs already
    assert default_splits(4096, 14336, 64, 128) == 5        # 64 column tiles: about 2 programs per SM
    assert default_splits(64, 100, 64, 128) == 1            # no more splits than BLOCK_K steps of K


def test_rejects():
    x, w, _ = operands(2, 32, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="the same K"):
        skinny_linear(x, w[:, :16])
    with pytest.raises(ValueError, match=rf"1..{MAX_ROWS} rows, got {MAX_ROWS + 1}"):
        skinny_linear(torch.zeros(MAX_ROWS + 1, 32, device=DEV), w)
    with pytest.raises(ValueError, match=r"bias must be \[8\]"):
        skinny_linear(x, w, torch.zeros(7, device=DEV))
    with pytest.raises(ValueError, match="splits must be 1..2 for K = 32, got 3"):
        skinny_linear(x, w, splits=3)


def test_benchmark_smoke(tmp_path):
    """The benchmark's CPU smoke run: one point, both timings, the kernel checked against torch."""
    import json

    from gpu_backend.bench.skinny_gemm import main

    assert main(["--out", str(tmp_path), "--smoke"]) == 0
    (row,) = json.loads((tmp_path / "skinny_gemm.json").read_text())["rows"]
    assert (row["M"], row["K"], row["N"]) == (3, 64, 48)
    assert row["torch"]["median_us"] > 0 and row["skinny"]["median_us"] > 0
    assert all(c["max_rel_err"] < 1e-4 for c in row["configs"])
