"""End-to-end properties of the simulator: conservation, determinism, closed forms."""

import numpy as np
import pandas as pd
import pytest

from granisim.costmodel import step_cost
from granisim.core.contract import BatchPlan, PlannedRequest, StepResult
from tests.granisim.simhelpers import run, small


@pytest.mark.parametrize("policy", ["granikv", "token", "paged16"])
def test_every_arrival_accounted_and_outputs_generated(policy):
    sc = small(**{"policy.name": policy})
    _, eng, res, reqs = run(sc)
    assert len(reqs) == sc.workload.num_requests
    assert reqs.rid.is_unique
    assert set(reqs.status) == {"completed"}
    assert (reqs.generated == reqs.output_len).all()
    assert (reqs.ttft_s > 0).all() and (reqs.e2e_s >= reqs.ttft_s).all()
    # everything released: only cached (evictable) tokens remain
    for name, ps in eng.allocator.stats().pools.items():
        assert ps.used == 0, name


def test_same_seed_same_result():
    a = run(small())[3]
    b = run(small())[3]
    pd.testing.assert_frame_equal(a, b)
    c = run(small(seed=4))[3]
    assert not a.arrival_s.equals(c.arrival_s)


def test_fast_forward_is_exact():
    sc = small(**{"workload.rate": 2.0})
    fast = run(sc)
    slow = run(sc.with_changes(**{"scheduler.fast_forward": False}))
    assert fast[2].steps.frame().num_steps.max() > 1, "fast-forward never engaged"
    cols = ["rid", "status", "ttft_s", "e2e_s", "generated"]
    pd.testing.assert_frame_equal(fast[3][cols], slow[3][cols], rtol=1e-9, atol=1e-9)
    assert fast[2].steps.frame().num_steps.sum() == len(slow[2].steps.frame())


def test_one_request_alone_matches_the_cost_model():
    sc = small(**{"workload.num_requests": 1, "workload.max_output_len": 8, "scheduler.max_batch_tokens": 65536})
    setup, _, res, reqs = run(sc)
    r = reqs.iloc[0]
    spec_prompt = int(r.prompt_len)
    prefill = BatchPlan(1, "granikv", 1, (PlannedRequest(0, 0, spec_prompt, True),))
    ttft = step_cost(prefill, setup.profile, setup.model).duration_s
    assert r.ttft_s == pytest.approx(ttft, rel=1e-12)
    n = int(r.output_len)
    decode = [step_cost(BatchPlan(2 + i, "granikv", 1, (PlannedRequest(0, spec_prompt + i, 1, False),)),
                        setup.profile, setup.model).duration_s for i in range(n - 1)]
    assert r.tpot_s == pytest.approx(np.mean(decode), rel=1e-9)


class FixedTime:
    """An executor whose step time ignores the policy, so every policy sees the same schedule."""

    needs_layouts = False
    max_steps_per_plan = 1

    def __init__(self):
        self.plans = []

    def execute(self, plan):
        self.plans.append(plan)
        return StepResult(0.01 + 1e-6 * plan.num_tokens)


def test_without_sharing_policies_differ_only_in_attention_terms():
    sc = small(**{"workload.kind": "azure", "workload.num_requests": 30, "workload.time_scale": 50.0,
                  "workload.max_output_len": 32})
    costs = {}
    for pol in ["granikv", "token", "paged16"]:
        ex = FixedTime()
        setup, *_ = run(sc.with_changes(**{"policy.name": pol}), ex)
        shapes = [[(p.rid, p.context_len, p.num_new) for p in plan.requests] for plan in ex.plans]
        costs[pol] = (shapes, [step_cost(p, setup.profile, setup.model).breakdown for p in ex.plans])
    ref_shapes, ref_bd = costs["granikv"]
    for pol, (shapes, bd) in costs.items():
        assert shapes == ref_shapes, f"{pol} scheduled differently"
        for a, b in zip(ref_bd, bd):
            for key in ("linear", "lm_head", "kv_write", "overhead"):
                assert a[key] == pytest.approx(b[key], rel=1e-12), (pol, key)
    attn = lambda bd: sum(x["attn_decode"] + x["attn_prefill"] for x in bd)
    assert attn(costs["token"][1]) != attn(costs["paged16"][1])


def test_preemption_under_memory_pressure_loses_nothing():
    for order in ("retract", "lifo"):
        sc = small(**{"hardware.kv_budget_tokens": 6000, "workload.rate": 200.0, "workload.max_output_len": 200,
                      "workload.suffix_scale": 0.3,
                      "scheduler.preempt_order": order, "scheduler.new_token_ratio": 0.0})
        _, eng, res, reqs = run(sc)
        assert set(reqs.status) == {"completed"}, order
        assert (reqs.generated == reqs.output_len).all()
        assert res.info["preemptions"] > 0, f"{order}: the budget was meant to force preemption"


def test_overload_completes_or_rejects_with_reason():
    sc = small(**{"workload.rate": 5000.0, "workload.num_requests": 120, "scheduler.max_waiting": 10})
    _, _, _, reqs = run(sc)
    assert len(reqs) == 120
    rej = reqs[reqs.status == "rejected"]
    assert len(rej) > 0 and (rej.reason.str.len() > 0).all()
    assert set(reqs.status) <= {"completed", "rejected"}


def test_granikv_uses_a_hot_slab_and_a_prefix_pass():
    sc = small(**{"workload.rate": 50.0})
    _, eng, res, _ = run(sc)
    st = eng.allocator.stats()
    assert st.hot_placements == sc.workload.roles
    steps = res.steps.frame()
    assert (steps.groups_cascade + steps.groups_dense).sum() > 0


def test_multi_turn_sessions_lose_no_turn_and_hit_their_own_context():
    sc = small(**{"workload.turns": 3, "workload.num_requests": 12, "workload.think_time_s": 0.0})
    _, eng, _, reqs = run(sc)
    assert len(reqs) == 36 and set(reqs.status) == {"completed"}
    later = reqs[reqs.turn > 0]
    # a follow-up turn finds its previous turn's prompt and outputs in the cache
    assert (later.cached_tokens > later.prompt_len * 0.5).all()


def test_follow_up_turns_are_the_same_under_every_policy():
    sc = small(**{"workload.turns": 3, "workload.num_requests": 10})
    seen = {}
    for pol in ("granikv", "token"):
        _, _, _, reqs = run(sc.with_changes(**{"policy.name": pol}))
        seen[pol] = reqs[["rid", "session", "turn", "prompt_len", "output_len"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(seen["granikv"], seen["token"])
