"""The split-along-KV planner: whole waves for slab/128-row passes, ~2 programs per SM for gathers,
and, in a batch whose longest sequence exceeds BALANCE_SKEW x the mean, no program walking more than
max(BALANCE_CHUNK, mean length) tokens."""
import types

import pytest

from gpu_backend.kernels import checks
from gpu_backend.kernels import split_kv
from gpu_backend.kernels.dense import _dense_splits
from gpu_backend.kernels.split_kv import MAX_SPLITS, plan_splits

H200 = types.SimpleNamespace(type="cuda", index=99)


@pytest.fixture(autouse=True)
def fake_h200(monkeypatch):
    monkeypatch.setitem(checks._SMS, 99, 132)


@pytest.mark.parametrize("base,L", [(8, 16384), (16, 16384), (64, 16384), (8, 4096), (128, 4096), (8, 1024)])
def test_whole_waves(base, L):
    n, chunk = plan_splits(base_programs=base, max_kv_len=L, block_n=64, device=H200, ctas_per_sm=1)
    assert n * chunk >= L > (n - 1) * chunk and chunk % 64 == 0
    assert base * n <= max(132, base)           # never a second, partial wave
    assert n == 1 or base * (n + 1) > 132 or (n + 1) * 256 > L  # and not fewer splits than fit


def test_gathers_round_up_to_two_per_sm():
    n, chunk = plan_splits(base_programs=8, max_kv_len=16384, block_n=64, device=H200, ctas_per_sm=2,
                           round_up=True)
    assert (n, chunk) == (32, 512)
    n, _ = plan_splits(base_programs=128, max_kv_len=16384, block_n=64, device=H200, ctas_per_sm=2,
                       round_up=True)
    assert n == 3


@pytest.mark.parametrize("base,L,mean", [(512, 16384, 1200), (512, 1025, 300), (8, 30000, 2000),
                                         (64, 10 ** 6, 10), (512, 300, 100), (512, 16384, 16384), (512, 30000, 17300),
                                         (512, 4100, 2050), (512, 4200, 2050)])
def test_chunk_cap(base, L, mean):
    """However many programs the base grid has, a batch whose longest sequence exceeds BALANCE_SKEW x
    the mean is cut into splits of at most max(BALANCE_CHUNK, mean) tokens (while MAX_SPLITS allows):
    one long sequence in a batch of short ones is cut up, a batch of similar lengths is not."""
    cap = split_kv.balance_cap(L, mean)
    skewed = L > split_kv.BALANCE_SKEW * mean
    assert cap == (max(split_kv.BALANCE_CHUNK, mean) if skewed else 0)
    n, chunk = plan_splits(base_programs=base, max_kv_len=L, block_n=64, device=H200, ctas_per_sm=2,
                           round_up=True, max_chunk=cap)
    assert n * chunk >= L > (n - 1) * chunk
    if skewed:
        bound = max(cap, -(-L // MAX_SPLITS), split_kv.MIN_CHUNK)
        assert chunk <= -(-bound // 64) * 64
    if not skewed or L <= cap:
        assert n == 1  # a full grid over similar lengths, or sequences within the cap, is not split
    assert split_kv.balance_cap(L, None) == 0 and split_kv.balance_cap(L, 0) == 0


def test_limits():
    assert plan_splits(base_programs=8, max_kv_len=0, block_n=64, device=H200) == (1, 64)
    assert plan_splits(base_programs=1, max_kv_len=10 ** 6, block_n=64, device=H200)[0] <= MAX_SPLITS
    with pytest.raises(ValueError, match="multiple of block_n"):
        plan_splits(base_programs=8, max_kv_len=1000, block_n=64, device=H200, kv_chunk=100)
    with pytest.raises(ValueError, match="at most 64"):
        plan_splits(base_programs=8, max_kv_len=10 ** 5, block_n=64, device=H200, kv_chunk=64)


def test_dense_prefers_full_last_wave():
    assert _dense_splits(160, 32768, 128, H200, None)[0] == 4    # 640 programs: 4.85 waves, not 1.2
    assert _dense_splits(128, 16384, 128, H200, None)[0] == 1    # one full wave already
    assert _dense_splits(64, 16384, 128, H200, None)[0] == 2


def test_dense_prices_the_partials_of_a_split():
    """Launches of a short prefix with many rows stay whole: on an H100 (bench/dense_splits.py) 80 programs over
    1K tokens ran 23 us unsplit and 56 us in the 3 splits that fill the last wave best; 160 programs over 4K,
    124 us unsplit against 164 in 4."""
    assert _dense_splits(80, 1024, 128, H200, None)[0] == 1
    assert _dense_splits(160, 4096, 128, H200, None)[0] == 1
    assert _dense_splits(16, 4096, 128, H200, None)[0] == 8     # few programs, long prefix: still split


@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("base,L,mean", [(512, 16384, 1200), (512, 30000, 17300), (32, 16384, 16384),
                                         (256, 18000, 5200), (8, 1025, 300), (1024, 14000, 1100)])
def test_cost_model_mirrors_planner(base, L, mean, gather):
    """granisim's split rule (CostTables.split_rule, h200 profile) gives the launcher's split count."""
    from granisim.costmodel import cost_tables
    from granisim.config.hardware import get_profile
    from granisim.config.models import get_model

    t = cost_tables(get_profile("h200"), get_model("llama-3.1-8b"))
    n_model, chunk_model = t.split_rule(base, L, 64.0, gather=gather, mean_len=mean)
    n, chunk = plan_splits(base_programs=base, max_kv_len=L, block_n=64, device=H200,
                           ctas_per_sm=2 if gather else 1, round_up=gather, max_chunk=split_kv.balance_cap(L, mean))
    assert (int(n_model), int(chunk_model)) == (n, chunk)
