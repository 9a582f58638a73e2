"""The tensor-parallel engine (gpu_backend/executor/tp.py) on the CPU under gloo: a tiny model split over two
ranks gives the same greedy tokens as the one-process engine, for every policy (the same plans, KV split by
heads across the ranks, two all-reduces per layer). Planted bugs: rank 1 keeping rank 0's query heads
(``q0, q1`` computed for rank 0 in tp.slicer) and a missing all-reduce after the down projection both make
the tokens diverge here."""

import pickle

import pytest

from gpu_backend.executor import GpuExecutor
from gpu_backend.executor.tp import TpShardExecutor, run_replica, serve_scenarios, shard_weights
from granisim.config.models import get_model
from granisim.config.scenario import parse_scenario
from granisim.core.serving_loop import ServingLoop
from granisim.experiments.run import prepare

SEED = 11
POLICIES = {"granikv": {"policy.name": "granikv", "policy.m_sat": 4, "policy.hot_fraction": 0.3},
            "token": {"policy.name": "token"}, "paged16": {"policy.name": "paged16"}}
BASE = {
    "name": "tiny-tp", "seed": 5,
    "model": {"name": "tiny-tp"},
    "hardware": {"kv_budget_tokens": 1024},
    "scheduler": {"max_batch_tokens": 64, "fast_forward": False},
    "workload": {"kind": "multi_agent", "roles": 2, "prefix_len": 24, "num_requests": 4, "rate": 1000.0,
                 "suffix_scale": 0.02, "max_output_len": 3},
}


def _scenario(policy: str, tp: int) -> dict:
    sc = parse_scenario(BASE).with_changes(**POLICIES[policy], **{"hardware.tp": tp})
    return sc.model_dump()


def _one_process(policy: str) -> dict:
    setup = prepare(parse_scenario(_scenario(policy, 1)))
    eng = ServingLoop(setup, GpuExecutor(setup.model, setup.kv_budget, device="cpu", seed=SEED), progress=False,
                      keep_outputs=True)
    eng.run()
    return {rid: list(map(int, t)) for rid, t in eng.outputs.items()}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / "tp2.pkl"
    run_replica(2, "tiny-tp", 1024, serve_scenarios, [_scenario(p, 2) for p in POLICIES], str(out),
                device="cpu", seed=SEED)
    return dict(zip(POLICIES, pickle.loads(out.read_bytes())))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_tp2_greedy_tokens_equal_tp1(two_ranks, policy):
    want = _one_process(policy)
    got = two_ranks[policy]["outputs"]
    assert len(want) == BASE["workload"]["num_requests"] and got.keys() == want.keys()
    for rid in want:
        assert got[rid] == want[rid], f"{policy}: request {rid} diverged at tp = 2"


def test_shards_hold_their_heads_and_columns():
    """Rank r holds query heads [r nq/tp, ...), its KV heads and its MLP columns: the two ranks' slices
    put together are the full weights."""
    import torch

    full = get_model("tiny-tp")
    w = shard_weights(full, 1, 0, device="cpu", seed=SEED)
    a, b = (shard_weights(full, 2, r, device="cpu", seed=SEED) for r in (0, 1))
    d, nq, nkv = full.head_dim, full.n_q_heads, full.n_kv_heads
    L0, La, Lb = w.layers[0], a.layers[0], b.layers[0]
    q = lambda t: t[: t.shape[0] * nq // (nq + 2 * nkv)]  # noqa: E731
    assert torch.equal(torch.cat([q(La.wqkv), q(Lb.wqkv)]), L0.wqkv[: nq * d])
    assert torch.equal(torch.cat([La.wo, Lb.wo], dim=1), L0.wo)
    assert torch.equal(torch.cat([La.w_down, Lb.w_down], dim=1), L0.w_down)
    assert a.shape.n_kv_heads == nkv // 2 and torch.equal(a.embed, w.embed)
    ex = TpShardExecutor(full, 2, 1, 64, device="cpu", seed=SEED)
    assert ex.k_cache[0].shape[1] == nkv // 2


def test_validate_runs_the_replicas_ranks(tmp_path, capsys):
    """`granisim validate` of a tp = 2 scenario starts both ranks (gloo here, NCCL on GPUs) and pairs rank 0's
    steps with the tp = 2 price (the shard plus its all-reduces); one process refuses to run a shard alone.
    Planted: validating with the one-process executor (the shard without its all-reduces) fails the first
    assertion."""
    import json

    from granisim.cli import main

    sc = tmp_path / "tp2.toml"
    sc.write_text('name = "tiny-tp-validate"\nseed = 5\n[model]\nname = "tiny-tp"\n[hardware]\n'
                  'kv_budget_tokens = 1024\ntp = 2\n[scheduler]\nmax_batch_tokens = 64\nfast_forward = false\n'
                  '[workload]\nkind = "multi_agent"\nroles = 2\nprefix_len = 24\nnum_requests = 4\nrate = 1000.0\n'
                  'suffix_scale = 0.02\nmax_output_len = 3\n')
    out = tmp_path / "val"
    assert main(["validate", str(sc), "--device", "cpu", "--out", str(out)]) == 0
    rep = json.loads((out / "validation.json").read_text())
    assert rep["executor"]["tp"] == 2 and rep["steps"] >= 3
    assert rep["end_to_end"]["throughput_rps"]["measured"] > 0
    assert main(["run", str(sc), "--executor", "gpu", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    assert "hardware.tp = 2" in capsys.readouterr().err
