"""The real engine's greedy tokens equal a plain full-attention forward, whatever the policy
and attention path (CPU: Triton interpreter, tiny fp32 model; GPU: Llama-3.1-8B shape, bf16)."""

import numpy as np
import pytest
import torch

from gpu_backend.executor import GpuExecutor
from gpu_backend.executor.reference import next_token_logits
from granisim.core.serving_loop import ServingLoop
from granisim.config.scenario import parse_scenario
from granisim.experiments.run import prepare

TINY = {
    "name": "tiny-engine", "seed": 5,
    "model": {"name": "tiny"},
    "hardware": {"kv_budget_tokens": 1536},
    "scheduler": {"max_batch_tokens": 96, "fast_forward": False},
    "workload": {"kind": "multi_agent", "roles": 3, "prefix_len": 40, "num_requests": 9, "rate": 1000.0,
                 "suffix_scale": 0.02, "max_output_len": 5, "turns": 2},
}


def _run(policy: str, m_sat: int, device="cpu", **options):
    sc = parse_scenario(TINY).with_changes(**{"policy.name": policy, "policy.m_sat": m_sat,
                                              "policy.hot_fraction": 0.3})
    setup = prepare(sc)
    ex = GpuExecutor(setup.model, setup.kv_budget, device=device, seed=11, **options)
    eng = ServingLoop(setup, ex, progress=False, keep_outputs=True)
    res = eng.run()
    return eng, res, ex


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name, policy, m_sat in [("dense", "granikv", 12), ("cascade", "granikv", 10**6), ("token", "token", 8),
                                ("paged16", "paged16", 8)]:
        out[name] = _run(policy, m_sat)
    return out


def test_paths_were_exercised(runs):
    steps = {k: v[1].steps.frame() for k, v in runs.items()}
    assert steps["dense"].groups_dense.sum() > 0
    assert steps["cascade"].groups_cascade.sum() > 0
    assert steps["token"].groups_paged.sum() >= 0 and (steps["token"].prefill_tokens > 0).any()


def test_greedy_tokens_identical_across_policies_and_paths(runs):
    ref = runs["token"][0].outputs
    assert len(ref) == 18  # 9 sessions x 2 turns, nothing lost
    for name, (eng, _, _) in runs.items():
        assert eng.outputs.keys() == ref.keys(), name
        for rid in ref:
            assert np.array_equal(eng.outputs[rid], ref[rid]), f"{name}: request {rid} diverged"


def test_greedy_tokens_match_a_full_attention_forward(runs):
    eng, res, ex = runs["dense"]
    specs = {}
    for r in res.records:
        specs[r.rid] = r
    # rebuild each request's prompt from the workload (same seed => same specs)
    wl = eng.workload
    prompts = {}
    for s in type(wl)(eng.setup.scenario.workload, eng.setup.scenario.seed, eng.setup.trace, eng.setup.model.vocab).initial():
        prompts[s.rid] = s.prompt()
    checked = 0
    for rid, outs in eng.outputs.items():
        if rid not in prompts:
            continue  # follow-up turns: their prompt embeds earlier outputs; covered by the policy test
        ctx = torch.from_numpy(prompts[rid])
        for t in outs:
            lg = next_token_logits(ex.w, ctx)
            assert int(lg.argmax()) == int(t), f"request {rid}: engine {t} vs reference {int(lg.argmax())}"
            ctx = torch.cat([ctx, torch.tensor([int(t)])])
            checked += 1
    assert checked >= 20


def test_out_of_range_slot_is_rejected_before_launch():
    from granisim.kv.layout import KVSegment, RequestLayout
    from granisim.config.models import get_model
    from granisim.core.contract import BatchPlan, PlannedRequest

    ex = GpuExecutor(get_model("tiny"), 64, device="cpu")
    lay = RequestLayout(0, (KVSegment("token", np.array([3, 99])),), 2, 0, None)
    plan = BatchPlan(1, "token", 1, (PlannedRequest(0, 0, 2, True, -1, 0, np.array([3, 99]),
                                                    np.array([1, 2]), lay),))
    with pytest.raises(ValueError, match="slot 99 outside the buffer of 64"):
        ex.execute(plan)


def test_out_of_range_read_is_rejected_before_launch():
    from granisim.kv.layout import KVSegment, RequestLayout
    from granisim.config.models import get_model
    from granisim.core.contract import BatchPlan, PlannedRequest

    ex = GpuExecutor(get_model("tiny"), 64, device="cpu")
    lay = RequestLayout(0, (KVSegment("token", np.array([70, 5, 6])),), 3, 0, None)
    plan = BatchPlan(1, "token", 1, (PlannedRequest(0, 2, 1, False, -1, 0, np.array([6]), np.array([1]), lay),))
    with pytest.raises(ValueError, match="reads slot 70 outside the buffer of 64"):
        ex.execute(plan)


def test_steps_that_build_a_kernel_are_rerun_with_the_same_result(runs, monkeypatch):
    """An eager step during which Triton built or loaded a kernel is re-run and the re-run timed:
    the re-run must write the same K/V and give the same tokens (here every other step 'builds')."""
    from gpu_backend.executor import executor as E

    forward = E.GpuExecutor._forward
    calls = []

    def building_forward(self, meta, timer):
        calls.append(1)
        if len(calls) % 2:
            E.CompileWatch.count += 1
        return forward(self, meta, timer)

    monkeypatch.setattr(E.GpuExecutor, "_forward", building_forward)
    eng, res, ex = _run("token", 8)
    assert ex.stats()["reruns"] == ex.stats()["eager_steps"] > 0
    assert eng.outputs.keys() == runs["token"][0].outputs.keys()
    for rid, out in runs["token"][0].outputs.items():
        assert np.array_equal(eng.outputs[rid], out), f"request {rid} diverged after re-runs"


@pytest.mark.parametrize("hold", [True, False])
def test_garbage_collections_are_held_off_during_a_step(hold):
    """With collections due every few allocations, none runs inside a timed step when held off
    (they run between steps), and some do when not: the watch sees both."""
    import gc

    before = gc.get_threshold()
    gc.set_threshold(20, 2, 2)
    try:
        _, _, ex = _run("token", 8, hold_gc=hold)
    finally:
        gc.set_threshold(*before)
    st = ex.stats()
    assert st["gc_collections"] > 0
    assert (st["gc_in_steps"] == 0) == hold, st


def test_metadata_buffer_growth_is_kept_off_the_step_clock(monkeypatch):
    """Growing the metadata buffers (allocations a warmed-up engine would not make) is a one-off
    outside the step's duration: with the step clock (on the CPU, perf_counter) made to jump 1000 s
    in every growth, no step's duration contains a jump."""
    import time
    from types import SimpleNamespace

    from gpu_backend.executor import timing
    from gpu_backend.executor.arena import MetaArena

    jumped = {"s": 0.0}
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + jumped["s"]))
    grow = MetaArena._grow

    def jumping_grow(self, name, n):
        jumped["s"] += 1000.0
        return grow(self, name, n)

    monkeypatch.setattr(MetaArena, "_grow", jumping_grow)
    _, res, ex = _run("token", 8)
    durations = res.steps.frame().duration_s
    assert ex.stats()["arena_growths"] >= 3
    assert durations.max() < 1000.0, durations.max()
