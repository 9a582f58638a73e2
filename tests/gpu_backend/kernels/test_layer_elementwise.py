"""The layer's fused element-wise kernels (add + RMS norm, RoPE in place, SwiGLU) against float64
references of the torch ops the unfused engine runs (gpu_backend/executor/model.py), on odd shapes:
rows not a power of two, hidden sizes off the block, strided rows, in place."""
import pytest
import torch
import torch.nn.functional as F

from gb_util import DEV
from gpu_backend.executor.model import rope_tables
from gpu_backend.kernels.rms_norm import add_rms_norm
from gpu_backend.kernels.rope import rope_
from gpu_backend.kernels.swiglu import swiglu

EPS = 1e-5
# |kernel - float64 reference|: one rounding to the dtype of values O(1-4)
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}


def rnd(*shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)


def near(got, ref, dtype, what):
    err = (got.double().cpu() - ref.double().cpu()).abs().max().item()
    assert err <= TOL[dtype] * max(1.0, ref.abs().max().item()), f"{what}: max error {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,H", [(1, 64), (7, 96), (13, 40)])
def test_add_rms_norm(dtype, T, H):
    x, d = rnd(T, H, dtype=dtype, seed=1), rnd(T, H, dtype=dtype, seed=2, scale=0.5)
    w = rnd(H, dtype=dtype, seed=3, scale=0.1) + 1
    xs, n = add_rms_norm(x, d, w, EPS)
    s = (x.double() + d.double()).to(dtype).double()  # the residual stream is kept in the model dtype
    near(xs, s, dtype, "x + delta")
    ref = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + EPS) * w.double()
    near(n, ref, dtype, "norm")
    near(n, F.rms_norm(s.to(dtype), (H,), w, EPS), dtype, "against F.rms_norm")
    x2, n2 = add_rms_norm(x, None, w, EPS)  # the norm alone
    assert x2 is x
    near(n2, x.double() * torch.rsqrt((x.double() ** 2).mean(-1, keepdim=True) + EPS) * w.double(), dtype, "norm alone")


def test_add_rms_norm_in_place_on_strided_rows():
    base = rnd(5, 80, dtype=torch.float32, seed=4)
    x = base[:, :48]  # rows strided by 80
    d, w = rnd(5, 48, dtype=torch.float32, seed=5), rnd(48, dtype=torch.float32, seed=6)
    want = x.double() + d.double()
    tail = base[:, 48:].clone()
    xs, n = add_rms_norm(x, d, w, EPS, out_x=x)
    assert xs.data_ptr() == x.data_ptr()
    near(x, want, torch.float32, "in place")
    assert torch.equal(base[:, 48:], tail), "columns past the row were written"
    near(n, want * torch.rsqrt((want ** 2).mean(-1, keepdim=True) + EPS) * w.double(), torch.float32, "norm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,nq,nkv,d", [(1, 4, 1, 16), (9, 5, 1, 32), (6, 12, 4, 64)])
def test_rope_in_place_matches_rotate_half(dtype, T, nq, nkv, d):
    n = nq + 2 * nkv
    y = rnd(T, n * d, dtype=dtype, seed=7)
    v_before = y[:, (nq + nkv) * d:].clone()
    pos = torch.tensor([3, 0, 17, 5, 1024, 9, 2, 33, 70000][:T], device=DEV)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    cos, sin = (t.to(dtype) for t in rope_tables(pos, inv.float().to(DEV), torch.float32))
    c, s = (t.double().cpu()[..., : d // 2] for t in (cos, sin))  # the tables as given, halves equal
    assert torch.equal(cos[..., : d // 2], cos[..., d // 2:])
    qk = y[:, : (nq + nkv) * d].double().cpu().view(T, nq + nkv, d)
    x1, x2 = qk[..., : d // 2], qk[..., d // 2:]
    ref = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    assert rope_(y, cos, sin, nq + nkv, d) is y
    near(y[:, : (nq + nkv) * d].view(T, nq + nkv, d), ref, dtype, "rope")
    assert torch.equal(y[:, (nq + nkv) * d:], v_before), "v heads must stay as they are"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,inter", [(1, 16), (5, 1500), (3, 2051)])
def test_swiglu(dtype, T, inter):
    gu = rnd(T, 2 * inter, dtype=dtype, seed=8, scale=2.0)
    g, u = gu[:, :inter].double(), gu[:, inter:].double()
    near(swiglu(gu), g * torch.sigmoid(g) * u, dtype, "swiglu")
    out = torch.full((T, inter), float("nan"), dtype=dtype, device=DEV)
    assert swiglu(gu, out=out) is out and not torch.isnan(out).any()


def test_errors_name_the_argument():
    x = rnd(3, 32, dtype=torch.float32, seed=9)
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm(x, rnd(3, 16, dtype=torch.float32, seed=1), torch.ones(32, device=DEV), EPS)
    with pytest.raises(ValueError, match="w must be"):
        add_rms_norm(x, None, torch.ones(31, device=DEV), EPS)
    with pytest.raises(ValueError, match="heads of 16"):
        rope_(x, x[:, :8], x[:, :8], 3, 16)
    with pytest.raises(ValueError, match="cos"):
        rope_(x, x[:2, :8], x[:, :8], 2, 16)
    with pytest.raises(ValueError, match="gu must be"):
        swiglu(x[:, :31])
    with pytest.raises(ValueError, match="out must be"):
        swiglu(x, out=x)

