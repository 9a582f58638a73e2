"""The real engine's logits and greedy tokens equal a plain full-attention forward, whatever the policy
and attention path (CPU: Triton interpreter, tiny fp32 model; the float64 reference shares only the weights)."""

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from gpu_backend.executor import GpuExecutor, rows
from gpu_backend.executor.reference import all_logits
from granisim.core.serving_loop import ServingLoop
from granisim.core.workload import Workload
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
LOGIT_RTOL = 1e-4  # relative L2 of the fp32 engine's logits against the float64 reference (seen: ~1e-6)


@dataclass
class Trace:
    """What a run did, step by step: each request's spec (its prompt), the engine's logits by the position
    they predict, and the host shape of every step the executor built."""
    specs: dict = field(default_factory=dict)
    logits: dict = field(default_factory=dict)  # rid -> {position predicted: logits}
    shapes: list = field(default_factory=list)
    plans: list = field(default_factory=list)


def _run(policy: str, m_sat: int, device="cpu", **options):
    sc = parse_scenario(TINY).with_changes(**{"policy.name": policy, "policy.m_sat": m_sat,
                                              "policy.hot_fraction": 0.3})
    setup = prepare(sc)
    ex = GpuExecutor(setup.model, setup.kv_budget, device=device, seed=11, keep_logits=True, **options)
    eng = ServingLoop(setup, ex, progress=False, keep_outputs=True)
    trace = Trace()
    s = setup.scenario
    trace.specs = {spec.rid: spec for spec in Workload(s.workload, s.seed, setup.trace, setup.model.vocab).initial()}
    follow_up, execute, build = eng.workload.follow_up, ex.execute, rows.build

    def recording_follow_up(*args, **kw):
        spec = follow_up(*args, **kw)
        if spec is not None:
            trace.specs[spec.rid] = spec
        return spec

    def recording_execute(plan):
        out = execute(plan)
        trace.plans.append((plan.step, plan.policy, plan.page_size, tuple(g.path for g in plan.groups)))
        for r in plan.requests:
            trace.logits.setdefault(r.rid, {})[r.context_len + r.num_new] = ex.last_logits[r.rid]
        return out

    def recording_build(plan, num_slots, pad=True, table=None):
        host = build(plan, num_slots, pad, table)
        trace.shapes.append((host.shape, [(r.is_prefill, r.context_len) for r in plan.requests]))
        return host

    eng.workload.follow_up, ex.execute = recording_follow_up, recording_execute
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rows, "build", recording_build)
        res = eng.run()
    return eng, res, ex, trace


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name, policy, m_sat, options in [("dense", "granikv", 12, {}), ("cascade", "granikv", 10**6, {}),
                                         ("token", "token", 8, {}), ("paged16", "paged16", 8, {}),
                                         ("dense_fused", "granikv", 12, {"fused_elementwise": True,
                                                                          "fold_merge": True}),
                                         ("cascade_folded", "granikv", 10**6, {"fold_merge": True})]:
        out[name] = _run(policy, m_sat, **options)
    return out


def test_paths_were_exercised(runs):
    """Each run took the path it is named for: dense and cascade prefix passes; the token run no prefix pass
    at all (its groups are 'paged': every member reads the shared prefix inside its own decode, through its own
    slot list); paged16 every step through 16-token page tables, decodes and cached extend contexts included.
    Planted bug: the paged policy's steps built with slot lists instead of page tables (``ps = 0`` in
    rows.build; its tokens stay right) fails here; the old check (``groups_paged.sum() >= 0``) passed anything."""
    steps = {k: v[1].steps.frame() for k, v in runs.items()}
    assert steps["dense"].groups_dense.sum() > 0
    assert steps["cascade"].groups_cascade.sum() > 0 and steps["cascade"].groups_dense.sum() == 0
    assert steps["dense_fused"].groups_dense.sum() > 0 and steps["cascade_folded"].groups_cascade.sum() > 0
    assert runs["dense_fused"][2].stats()["fold_merge"] and runs["cascade_folded"][2].stats()["fold_merge"]
    token = steps["token"]
    assert (token.groups_dense + token.groups_cascade == 0).all()
    assert all(set(paths) <= {"paged"} for *_, paths in runs["token"][3].plans)
    assert (token.prefill_tokens > 0).any() and (token.decode_requests > 0).any()
    assert all(shape.page_size == 0 and not shape.passes for shape, _ in runs["token"][3].shapes)
    paged = runs["paged16"][3]
    assert paged.plans and all(ps == 16 for _, _, ps, _ in paged.plans)
    assert paged.shapes and all(shape.page_size == 16 for shape, _ in paged.shapes)
    assert any(shape.dec_rows for shape, _ in paged.shapes)  # decodes read through the page table
    assert any(pre and ctx > 0 for _, reqs in paged.shapes for pre, ctx in reqs)  # and cached extend contexts
    for name, (_, _, ex, trace) in runs.items():  # decode rows read through the request table (request_table.py)
        stats = ex.stats()
        assert stats["request_table"] and stats["table_patched_entries"] > 0, name
        assert all(shape.table for shape, _ in trace.shapes), name


def test_greedy_tokens_identical_across_policies_and_paths(runs):
    ref = runs["token"][0].outputs
    assert len(ref) == 18  # 9 sessions x 2 turns, nothing lost
    for name, (eng, _, _, _) in runs.items():
        assert eng.outputs.keys() == ref.keys(), name
        for rid in ref:
            assert np.array_equal(eng.outputs[rid], ref[rid]), f"{name}: request {rid} diverged"


@pytest.mark.parametrize("name", ["dense", "cascade", "token", "paged16", "dense_fused", "cascade_folded"])
def test_logits_match_a_full_attention_forward_on_every_turn(runs, name):
    """Every generated token of every request, first turns and follow-ups alike (a follow-up's prompt holds the
    earlier turn and its outputs, read from the cache): the engine's logits are the float64 reference's over
    the request's whole sequence (relative L2 < LOGIT_RTOL) and its token is the reference's argmax.
    Planted bugs: RoPE rotating the other way (the rotate-half sign flipped in model.qkv_proj) and the MLP's
    gate and up halves swapped (``up, gate = ...chunk(2)`` in model.attn_out_and_mlp) both fail here; the old
    reference called the engine's own qkv_proj / rope_tables / MLP and could not see either. `dense_fused` runs
    the layers' element-wise work in the fused kernels (model.FusedLayers); planted there: the last MLP output
    left out of the final norm (``pending = None`` in FusedLayers.final), the residual add skipped before the
    attention norm (``self._add_norm(None, ...)`` in attn_in) — both fail. `dense_fused` and `cascade_folded`
    also merge the suffix half in the prefix passes' combine (``fold_merge``); planted: the suffix state left
    out of the combine — fails."""
    eng, _, _, trace = runs[name]
    checked = 0
    for rid, outs in eng.outputs.items():
        spec = trace.specs[rid]
        prompt = spec.prompt()
        seq = torch.from_numpy(np.concatenate([prompt, outs[:-1]]).astype(np.int64))
        ref = all_logits(runs[name][2].w, seq)
        for n, tok in enumerate(outs):
            pos = len(prompt) + n  # the position this token was sampled for
            got = trace.logits[rid][pos].double()
            want = ref[pos - 1]
            err = float((got - want).norm() / want.norm())
            assert err < LOGIT_RTOL, f"{name}: request {rid} token {n}: relative L2 {err:.2e}"
            assert int(tok) == int(want.argmax()) == int(got.argmax()), f"{name}: request {rid} token {n}"
            checked += 1
    assert checked == 18 * 5  # every token of both turns
    assert any(trace.specs[rid].prompt_len > 60 for rid in eng.outputs)  # follow-ups: earlier turn in the prompt


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

    def building_forward(self, meta, timer, *rest):
        calls.append(1)
        if len(calls) % 2:
            E.CompileWatch.count += 1
        return forward(self, meta, timer, *rest)

    monkeypatch.setattr(E.GpuExecutor, "_forward", building_forward)
    eng, res, ex, _ = _run("token", 8)
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
        _, _, ex, _ = _run("token", 8, hold_gc=hold)
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
    _, res, ex, _ = _run("token", 8)
    durations = res.steps.frame().duration_s
    assert ex.stats()["arena_growths"] >= 3
    assert durations.max() < 1000.0, durations.max()
