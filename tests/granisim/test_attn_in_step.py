"""The factor on a step's prefill and prefix attention by the step's tokens (engine.attn_in_step_per_ktok)."""
import numpy as np
import pandas as pd
import pytest

import granisim.costmodel.step as step_mod
from granisim.config.hardware import get_profile, with_values
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup
from granisim.costmodel import step_cost
from granisim.validation.refit import fit_attn_in_step

KEY = "engine.attn_in_step_per_ktok"
SLOPE = 0.012
MODEL = get_model("llama-3.1-8b")
BASE = with_values(get_profile("h200-engine"), {KEY: 0.0})
HOT = with_values(BASE, {KEY: SLOPE})


def _ratio(plan, part):
    new, old = (step_cost(plan, p, MODEL).breakdown[part] for p in (HOT, BASE))
    return new / old


@pytest.mark.parametrize("chunks,decodes", [([8192], 0), ([3000, 1000], 0), ([500], 12), ([1], 0)])
def test_prefill_attention_is_scaled_by_the_steps_tokens(chunks, decodes):
    reqs = [PlannedRequest(i, 0, q, True) for i, q in enumerate(chunks)]
    reqs += [PlannedRequest(100 + i, 4096, 1, False) for i in range(decodes)]
    plan = BatchPlan(0, "token", 1, tuple(reqs))
    tokens = sum(chunks) + decodes  # the step's GEMM rows: its decodes' tokens too
    assert _ratio(plan, "attn_prefill") == pytest.approx(1 + SLOPE * tokens / 1000, rel=1e-12)
    for part in ("linear", "attn_decode", "kv_write", "overhead"):  # nothing else moves
        assert step_cost(plan, HOT, MODEL).breakdown[part] == step_cost(plan, BASE, MODEL).breakdown[part]


def test_prefix_passes_beside_prefill_work_are_scaled_and_decode_steps_are_left_alone():
    group = PrefixGroup(7, 16384, "slab", "cascade", tuple(range(8)), 8 * MODEL.group_size)
    members = tuple(PlannedRequest(i, 16384 + 10, 1, False, group=0, shared_len=16384) for i in range(8))
    decode_only = BatchPlan(0, "granikv", 1, members, groups=(group,))
    assert step_cost(decode_only, HOT, MODEL) == step_cost(decode_only, BASE, MODEL)
    mixed = BatchPlan(0, "granikv", 1, (*members, PlannedRequest(9, 0, 4000, True)), groups=(group,))
    assert _ratio(mixed, "attn_prefix") == pytest.approx(1 + SLOPE * 4008 / 1000, rel=1e-12)


def test_the_shipped_default_is_no_term():
    plan = BatchPlan(0, "token", 1, (PlannedRequest(0, 0, 8192, True),))
    assert get_profile("h200")[KEY] == 0.0
    assert step_cost(plan, with_values(get_profile("h200"), {KEY: 0.0}), MODEL) == \
        step_cost(plan, get_profile("h200"), MODEL)


def _steps(slope, seed=0, n=80):
    rng = np.random.default_rng(seed)
    tokens = rng.choice([64, 512, 2048, 4096, 8192], n)
    pre = rng.uniform(1e-3, 5e-2, n)
    pfx = np.where(rng.random(n) < 0.3, rng.uniform(1e-3, 1e-2, n), 0.0)
    f = 1 + slope * tokens / 1000
    return pd.DataFrame({"tokens": tokens, "prefill_requests": rng.integers(0, 3, n),
                         "predicted_attn_prefill": pre, "predicted_attn_prefix": pfx,
                         "measured_attn_prefill": pre * f, "measured_attn_prefix": pfx * f})


def test_the_fit_recovers_a_planted_slope_from_prefill_steps_only():
    steps = _steps(0.011)
    dec = steps.prefill_requests == 0
    steps.loc[dec, "measured_attn_prefill"] *= 3.0  # decode-only steps: anything, never fitted
    assert fit_attn_in_step(steps) == pytest.approx(0.011, rel=1e-9)
    assert fit_attn_in_step(_steps(-0.02)) == 0.0  # never below 0
    with pytest.raises(ValueError, match="no step with prefill work"):
        fit_attn_in_step(steps[dec])


def test_a_factor_by_requests_instead_of_tokens_fails_the_pricing_test(monkeypatch):
    """Planted bug: the factor counted per prefilling request, not per 1000 tokens, is caught."""
    original = step_mod.StepPricing.step_block

    def per_request(self, plan):
        saved = self.attn_ktok
        n = sum(r.is_prefill for r in plan.requests)
        tokens = sum(r.num_new for r in plan.requests)
        self.attn_ktok = saved * n * 1000 / tokens if saved and tokens else saved
        try:
            return original(self, plan)
        finally:
            self.attn_ktok = saved

    monkeypatch.setattr(step_mod.StepPricing, "step_block", per_request)
    with pytest.raises(AssertionError):
        test_prefill_attention_is_scaled_by_the_steps_tokens([8192], 0)
