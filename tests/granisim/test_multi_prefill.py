"""The factor on an eager step's prefill attention by the requests it prefills (engine.eager.attn_prefill.multi_*)."""
import pytest

import granisim.costmodel.step as step_mod
from granisim.config.hardware import get_profile, with_values
from granisim.config.models import get_model
from granisim.costmodel import step_cost
from granisim.costmodel.correction import multi_prefill_factor
from granisim.validation.refit import IN_STEP_NONE
from granisim.core.contract import BatchPlan, PlannedRequest

GAIN = 0.3
MODEL = get_model("llama-3.1-8b")
# the shipped corrections without the in-step attention scales (tests/granisim/test_attn_in_step.py): this term alone
SHIPPED = with_values(get_profile("h200-engine"), IN_STEP_NONE)
GRAPH_MAX = int(SHIPPED["engine.graph_max_tokens"])
# the eager prefill correction's offset a step (scale 1), for this model's layers
OFFSET = SHIPPED["engine.eager.attn_prefill.offset_s"] * MODEL.num_layers / SHIPPED["engine.fit_layers"]


def _plan(chunks, context=0):
    """One step prefilling a request per chunk (its new tokens), each over ``context`` cached tokens."""
    return BatchPlan(0, "granikv", 1, tuple(PlannedRequest(i, context, q, True) for i, q in enumerate(chunks)))


def _kernel_ratio(chunks, context=0, **values):
    """The step's prefill attention less its engine offset, with the factor set as ``values`` / without it."""
    prof = with_values(SHIPPED, {"engine.eager.attn_prefill.multi_gain": GAIN, **values})
    plan = _plan(chunks, context)
    new, old = (step_cost(plan, p, MODEL).breakdown["attn_prefill"] for p in (prof, SHIPPED))
    return (new - OFFSET) / (old - OFFSET)


def test_the_default_changes_nothing():
    """multi_gain 0 (every shipped profile) prices a several-request eager step exactly as without the term."""
    assert SHIPPED["engine.eager.attn_prefill.multi_gain"] == 0.0
    plan = _plan([2048, 2048, 2048])
    zero = with_values(SHIPPED, {"engine.eager.attn_prefill.multi_gain": 0.0})
    assert step_cost(plan, zero, MODEL) == step_cost(plan, SHIPPED, MODEL)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_kernel_time_is_scaled_by_the_requests_prefilled(n):
    assert _kernel_ratio([6000 // n] * n) == pytest.approx(1 + GAIN * (n - 1) / n, rel=1e-9)


def test_one_request_and_graph_steps_are_left_alone():
    assert _kernel_ratio([6000]) == pytest.approx(1.0, rel=1e-12)
    assert sum([1000, 1000]) <= GRAPH_MAX  # a CUDA-graph step: not eager
    assert _kernel_ratio([1000, 1000]) == pytest.approx(1.0, rel=1e-12)


def test_cached_context_takes_its_share_of_the_gain():
    assert _kernel_ratio([3000, 3000], context=4096, **{"engine.eager.attn_prefill.multi_cached": 0.0}) == \
        pytest.approx(1.0, rel=1e-12)
    assert _kernel_ratio([3000, 3000], context=4096, **{"engine.eager.attn_prefill.multi_cached": 0.5}) == \
        pytest.approx(1 + 0.5 * GAIN / 2, rel=1e-9)
    # one request without cached context is enough for the whole gain
    prof = with_values(SHIPPED, {"engine.eager.attn_prefill.multi_gain": GAIN,
                                 "engine.eager.attn_prefill.multi_cached": 0.0})
    mixed = BatchPlan(0, "granikv", 1, (PlannedRequest(0, 4096, 3000, True), PlannedRequest(1, 0, 3000, True)))
    new, old = (step_cost(mixed, p, MODEL).breakdown["attn_prefill"] for p in (prof, SHIPPED))
    assert (new - OFFSET) / (old - OFFSET) == pytest.approx(1 + GAIN / 2, rel=1e-9)


def _per_request_checks():
    """The term's invariants: the same requests over more tokens get the same factor; the same tokens over
    more requests a larger one."""
    assert _kernel_ratio([1100, 1100]) == pytest.approx(_kernel_ratio([4000, 4000]), rel=1e-9)
    assert _kernel_ratio([6144]) == pytest.approx(1.0, rel=1e-12)
    assert _kernel_ratio([2048, 2048, 2048]) == pytest.approx(1 + GAIN * 2 / 3, rel=1e-9)


def test_the_factor_counts_requests_not_tokens(monkeypatch):
    """Planted bug: the factor counted per 2048 tokens prefilled instead of per request fails the checks."""
    _per_request_checks()

    def per_token(reqs, gain, cached):
        return multi_prefill_factor([None] * max(1, sum(r.num_new for r in reqs) // 2048), gain, cached)

    monkeypatch.setattr(step_mod, "multi_prefill_factor", per_token)
    with pytest.raises(AssertionError):
        _per_request_checks()


def test_the_factor_saturates():
    f = [multi_prefill_factor([PlannedRequest(i, 0, 10, True) for i in range(n)], GAIN, 1.0) for n in range(1, 40)]
    assert f[0] == 1.0 and all(a < b for a, b in zip(f, f[1:])) and f[-1] < 1 + GAIN
