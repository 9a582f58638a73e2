"""The scales of a step's prefill and prefix attention between its GEMMs (engine.attn_in_step.*)."""
import numpy as np
import pandas as pd
import pytest

import granisim.costmodel.step as step_mod
from granisim.config.hardware import get_profile, with_values
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup
from granisim.costmodel import step_cost
from granisim.validation.refit import IN_STEP_KEYS, IN_STEP_NONE, fit_attn_in_step

OWN, CONTEXT, PER_KTOK = 1.2, 0.94, 0.016
MODEL = get_model("llama-3.1-8b")
BASE = with_values(get_profile("h200-engine"), IN_STEP_NONE)
HOT = with_values(BASE, dict(zip(IN_STEP_KEYS, (OWN, CONTEXT, PER_KTOK))))


def _ratio(plan, part):
    new, old = (step_cost(plan, p, MODEL).breakdown[part] for p in (HOT, BASE))
    return new / old


@pytest.mark.parametrize("chunks,context,decodes", [([8192], 0, 0), ([3000, 1000], 0, 0), ([500], 16384, 12),
                                                    ([2048, 512], 4096, 3), ([1], 100, 0)])
def test_prefill_attention_takes_each_share_at_its_scale(chunks, context, decodes):
    reqs = [PlannedRequest(i, context, q, True) for i, q in enumerate(chunks)]
    reqs += [PlannedRequest(100 + i, 4096, 1, False) for i in range(decodes)]
    plan = BatchPlan(0, "token", 1, tuple(reqs))
    tokens = sum(chunks) + decodes  # the step's GEMM rows: its decodes' tokens too
    own = sum(q * (q + 1) / 2 for q in chunks)
    w = own / (own + sum(q * context for q in chunks))
    expected = w * OWN + (1 - w) * (CONTEXT + PER_KTOK * tokens / 1000)
    assert _ratio(plan, "attn_prefill") == pytest.approx(expected, rel=1e-12)
    for part in ("linear", "attn_decode", "kv_write", "overhead"):  # nothing else moves
        assert step_cost(plan, HOT, MODEL).breakdown[part] == step_cost(plan, BASE, MODEL).breakdown[part]


def test_prefix_passes_beside_prefill_work_take_the_context_scale_and_decode_steps_are_left_alone():
    group = PrefixGroup(7, 16384, "slab", "cascade", tuple(range(8)), 8 * MODEL.group_size)
    members = tuple(PlannedRequest(i, 16384 + 10, 1, False, group=0, shared_len=16384) for i in range(8))
    decode_only = BatchPlan(0, "granikv", 1, members, groups=(group,))
    assert step_cost(decode_only, HOT, MODEL) == step_cost(decode_only, BASE, MODEL)
    mixed = BatchPlan(0, "granikv", 1, (*members, PlannedRequest(9, 0, 4000, True)), groups=(group,))
    assert _ratio(mixed, "attn_prefix") == pytest.approx(CONTEXT + PER_KTOK * 4008 / 1000, rel=1e-12)


def test_without_the_scales_a_profile_prices_as_before():
    plan = BatchPlan(0, "token", 1, (PlannedRequest(0, 0, 8192, True),))
    assert all(get_profile("h200")[k] == v for k, v in IN_STEP_NONE.items())
    assert step_cost(plan, with_values(get_profile("h200"), IN_STEP_NONE), MODEL) == \
        step_cost(plan, get_profile("h200"), MODEL)


def _steps(own, context, per_ktok, seed=0, n=120):
    rng = np.random.default_rng(seed)
    tokens = rng.choice([64, 512, 2048, 4096, 8192], n)
    pre = rng.uniform(1e-3, 5e-2, n)
    pfx = np.where(rng.random(n) < 0.3, rng.uniform(1e-3, 1e-2, n), 0.0)
    w = rng.uniform(0.0, 1.0, n)
    c = context + per_ktok * tokens / 1000
    return pd.DataFrame({"tokens": tokens, "prefill_requests": rng.integers(0, 3, n), "self_share": w,
                         "predicted_attn_prefill": pre, "predicted_attn_prefix": pfx,
                         "measured_attn_prefill": pre * (w * own + (1 - w) * c), "measured_attn_prefix": pfx * c})


def test_the_fit_recovers_planted_scales_from_prefill_steps_only():
    steps = _steps(1.22, 0.94, 0.016)
    dec = steps.prefill_requests == 0
    steps.loc[dec, "measured_attn_prefill"] *= 3.0  # decode-only steps: anything, never fitted
    fitted = fit_attn_in_step(steps)
    assert [fitted[k] for k in IN_STEP_KEYS] == pytest.approx([1.22, 0.94, 0.016], rel=1e-9)
    assert fit_attn_in_step(_steps(1.1, 1.05, -0.01))[IN_STEP_KEYS[2]] == 0.0  # never below 0
    with pytest.raises(ValueError, match="no step with prefill work"):
        fit_attn_in_step(steps[dec])


def test_a_step_share_by_tokens_instead_of_flops_fails_the_pricing_test(monkeypatch):
    """Planted bug: the share over the requests' own tokens counted as q / (q + c) (tokens), not by the
    causal FLOPs q (q + 1) / 2 against q c, is caught."""
    def by_tokens(num_new, context_len, rows):
        q = sum(num_new[i] for i in rows)
        return q / (q + sum(context_len[i] for i in rows))

    monkeypatch.setattr(step_mod, "self_share", by_tokens)
    with pytest.raises(AssertionError):
        test_prefill_attention_takes_each_share_at_its_scale([500], 16384, 12)
