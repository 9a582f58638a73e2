"""KV write: scatter [T, n_kv, d] rows into their slots; nothing else changes."""
import pytest
import torch

from gb_util import DEV, caches, i32
from gpu_backend.kernels import reference as R
from gpu_backend.kernels.kv_write import write_kv


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,n_kv,d", [(1, 1, 64), (37, 3, 64), (70, 8, 128), (0, 2, 64)])
def test_write_matches_reference(T, n_kv, d, dtype):
    g = torch.Generator().manual_seed(T + n_kv)
    kc, vc = caches(300, n_kv, d, dtype, g)
    k = torch.randn(T, n_kv, d, generator=g).to(dtype).to(DEV)
    v = torch.randn(T, n_kv, d, generator=g).to(dtype).to(DEV)
    slots = i32(torch.randperm(300, generator=g)[:T])
    rk, rv = R.kv_write(kc, vc, k, v, slots)
    write_kv(k_cache=kc, v_cache=vc, k=k, v=v, slots=slots)
    assert torch.equal(kc.cpu(), rk) and torch.equal(vc.cpu(), rv)


def test_write_from_packed_qkv_view():
    """k, v as views into a packed qkv projection [T, n_q + 2 n_kv, d]."""
    g = torch.Generator().manual_seed(0)
    kc, vc = caches(50, 2, 64, torch.float16, g)
    qkv = torch.randn(9, 8 + 4, 64, generator=g).half().to(DEV)
    k, v = qkv[:, 8:10], qkv[:, 10:12]
    slots = i32(torch.randperm(50, generator=g)[:9])
    rk, rv = R.kv_write(kc, vc, k, v, slots)
    write_kv(k_cache=kc, v_cache=vc, k=k, v=v, slots=slots)
    assert torch.equal(kc.cpu(), rk) and torch.equal(vc.cpu(), rv)


def test_write_rejects_bad_slots():
    g = torch.Generator().manual_seed(0)
    kc, vc = caches(20, 1, 64, torch.float16, g)
    k = torch.randn(3, 1, 64).half().to(DEV)
    before = kc.clone()
    with pytest.raises(ValueError, match=r"slots\[2\] = 20 is not a slot id in \[0, num_slots=20\)"):
        write_kv(k_cache=kc, v_cache=vc, k=k, v=k, slots=i32([0, 1, 20]))
    with pytest.raises(ValueError, match="slots repeats slot id 4"):
        write_kv(k_cache=kc, v_cache=vc, k=k, v=k, slots=i32([4, 1, 4]))
    with pytest.raises(ValueError, match="slots has dtype"):
        write_kv(k_cache=kc, v_cache=vc, k=k, v=k, slots=torch.tensor([0, 1, 2], device=DEV))
    with pytest.raises(ValueError, match="k has dtype"):
        write_kv(k_cache=kc, v_cache=vc, k=k.float(), v=k, slots=i32([0, 1, 2]))
    assert torch.equal(kc, before)
