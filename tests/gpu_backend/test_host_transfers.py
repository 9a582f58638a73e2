"""The real engine with the host KV tier (CPU: Triton interpreter, tiny model): a prefix evicted to host and
prefetched back gives the same greedy tokens as with the tier off (where it is recomputed), and both the
slab and the page-granular paths ran."""

import os

import numpy as np
import pytest
import torch

from gpu_backend.executor import for_setup
from gpu_backend.executor.transfers import HostKV
from granisim.config.scenario import parse_scenario
from granisim.core.serving_loop import ServingLoop
from granisim.experiments.run import prepare
from granisim.kv.host_tier import KVTransfer

# 4 roles of 48-token prefixes through a KV budget that holds about two: prefixes are evicted and come back
# (the budgets below are the ones where the tier prefetches: checked in the test)
TINY = {
    "name": "tiny-host", "seed": 3,
    "model": {"name": "tiny"},
    "scheduler": {"max_batch_tokens": 96, "fast_forward": False, "max_running": 1},
    "workload": {"kind": "multi_agent", "roles": 4, "prefix_len": 48, "num_requests": 12, "rate": 1e6,
                 "suffix_scale": 0.02, "max_output_len": 4},
}


def _run(policy: str, host_gb: float, tier: str, budget: int):
    changes = {"policy.name": policy, "hardware.host_kv_gb": host_gb, "hardware.kv_budget_tokens": budget}
    if policy == "granikv":
        changes["policy.hot_fraction"] = 0.3
    if host_gb:
        changes["policy.host_tier"] = tier
    setup = prepare(parse_scenario(TINY).with_changes(**changes))
    ex = for_setup(setup, device="cpu")
    loop = ServingLoop(setup, ex, progress=False, keep_outputs=True)
    res = loop.run()
    assert all(r.status == "completed" for r in res.records)
    return {rid: tuple(int(x) for x in out) for rid, out in loop.outputs.items()}, ex, loop


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU run needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("policy, tier, budget, kind", [("granikv", "slabs", 200, "slab_copies"),
                                                         ("token", "slabs+pages", 160, "page_copies")])
def test_prefetched_prefix_gives_the_same_tokens(policy, tier, budget, kind):
    off, _, _ = _run(policy, 0.0, tier, budget)
    on, ex, loop = _run(policy, 1e-3, tier, budget)  # 1 MB of host memory: many tiny-model prefixes
    assert loop.allocator.host_tier.prefetches > 0, "the workload never prefetched: the test would prove nothing"
    assert getattr(ex.host_kv, kind) > 0
    assert on == off


@pytest.mark.parametrize("chunk", [2, 3, 64])
def test_host_kv_moves_slab_and_pages_both_ways(chunk):
    """Rows come back where they were, through a staging buffer of ``chunk`` tokens (smaller than a transfer:
    chunks and runs of host slots cut each other), and each run of host slots is one copy."""
    k = [torch.arange(40 * 2 * 4, dtype=torch.float32).reshape(40, 2, 4) + 1000 * i for i in range(2)]
    v = [x + 0.5 for x in k]
    k0, v0 = [x.clone() for x in k], [x.clone() for x in v]
    per_token = 2 * 2 * 2 * 4 * 4  # K and V, 2 layers, 2 heads, 4 dims, fp32
    host = HostKV(2, 2, 4, torch.float32, torch.device("cpu"), 24, stage_bytes=chunk * per_token)
    assert host.chunk == min(chunk, 24)
    gpu_pages, host_pages = np.array([30, 3, 17, 5, 6]), np.array([20, 21, 9, 10, 11])  # host: runs of 2 and 3
    moves = [(np.arange(8, 16), np.arange(0, 8), True), (gpu_pages, host_pages, False)]
    for g, h, slab in moves:
        host.move(KVTransfer("to_host", g, h, g.size, slab, 1), k, v)
    for x in k + v:
        x.zero_()
    for g, h, slab in moves:
        host.move(KVTransfer("to_gpu", g, h, g.size, slab, 1), k, v)
    idx = np.r_[8:16, gpu_pages]
    for a, b in zip(k + v, k0 + v0):
        assert torch.equal(a[idx], b[idx])
        assert not a[np.setdiff1d(np.arange(40), idx)].any()
    assert (host.slab_copies, host.page_copies) == (2, 2)
    chunks = lambda n: -(-n // host.chunk)  # noqa: E731
    per_way = chunks(8) + (2 if chunk >= 5 else 3)  # pages: chunk 2 cuts [0,2) [2,4) [4]; 3 cuts [0,2) [2,3) [3,5)
    assert host.host_copies == 2 * per_way
