"""Step-class factors: which class a plan is, a profile's factors priced on their class alone, bad sections."""
import copy
import json
from dataclasses import replace

import pytest

from granisim.config.coefficients import Source, StepClasses
from granisim.config.hardware import PROFILE_DIR, ProfileError, get_profile, load_profile
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest
from granisim.costmodel import step_cost
from granisim.costmodel.executor import CostExecutor
from granisim.costmodel.step_classes import CLASSES, classify, plan_class

LLAMA = get_model("llama-3.1-8b")
SHIPPED = get_profile("h200-engine")


def _decode(n, policy="granikv", page_size=1, steps=1):
    reqs = tuple(PlannedRequest(i, 1000 + 10 * i, 1, False) for i in range(n))
    return BatchPlan(0, policy, page_size, reqs, num_steps=steps)


def _prefill(*reqs):
    """One step prefilling (context, new tokens) per request."""
    return BatchPlan(0, "granikv", 1, tuple(PlannedRequest(i, c, n, True) for i, (c, n) in enumerate(reqs)))


def test_classes_by_batch_tokens_prefilling_requests_and_context():
    assert [classify(1, b, 0, False) for b in (1, 4, 5, 16, 17, 64, 65, 400)] == [
        "decode 1-4", "decode 1-4", "decode 5-16", "decode 5-16", "decode 17-64", "decode 17-64", "decode 65+",
        "decode 65+"]
    assert classify(512, 1, 1, True) == "prefill <=512 x1 fresh"
    assert classify(513, 9, 2, False) == "prefill <=2048 x2 cached"
    assert classify(2049, 3, 3, True) == "prefill <=8191 x3 fresh"
    assert classify(8191, 12, 7, False) == "prefill <=8191 x4+ cached"
    assert classify(8192, 12, 7, False) == "prefill >=8192 x4+ cached"
    labels = {classify(t, b, n, f) for t in (1, 600, 5000, 8192) for b in (1, 8, 40, 90) for n in range(6)
              for f in (False, True)}
    assert labels <= set(CLASSES) and len(CLASSES) == len(set(CLASSES)) == 4 + 4 * 4 * 2


def test_a_plan_is_fresh_when_one_prefilling_request_has_no_cached_context():
    """Decode rows do not count: a chunk over cached context beside decodes is cached."""
    assert plan_class(_prefill((0, 3000))) == "prefill <=8191 x1 fresh"
    assert plan_class(_prefill((4096, 1000))) == "prefill <=2048 x1 cached"
    assert plan_class(_prefill((4096, 1000), (0, 600))) == "prefill <=2048 x2 fresh"
    mixed = BatchPlan(0, "granikv", 1, (PlannedRequest(0, 4096, 100, True), PlannedRequest(1, 0, 1, False)))
    assert plan_class(mixed) == "prefill <=512 x1 cached"
    assert plan_class(_decode(20)) == "decode 17-64"


def _with_factors(factors):
    return replace(SHIPPED, step_classes=StepClasses(factors, Source("measured", date="d", command="c")))


def test_a_factor_prices_its_model_policy_and_class_alone():
    """Planted bugs caught: a factor applied to every class, to every policy, or to a tensor-parallel shard."""
    prof = _with_factors({"llama-3.1-8b": {"granikv": {"decode 1-4": 1.25}, "paged16": {"decode 5-16": 0.8}}})
    base = step_cost(_decode(3), SHIPPED, LLAMA)
    got = step_cost(_decode(3), prof, LLAMA)
    assert got.duration_s == pytest.approx(1.25 * base.duration_s, rel=1e-12)
    assert sum(got.breakdown.values()) == pytest.approx(got.duration_s, rel=1e-9)
    for plan in (_decode(8), _decode(3, policy="token"), _decode(3, policy="paged", page_size=32)):
        assert step_cost(plan, prof, LLAMA) == step_cost(plan, SHIPPED, LLAMA)
    paged = _decode(8, policy="paged", page_size=16)
    assert step_cost(paged, prof, LLAMA).duration_s == pytest.approx(0.8 * step_cost(paged, SHIPPED, LLAMA).duration_s)
    qwen = get_model("qwen-2.5-14b")
    assert step_cost(_decode(3), prof, qwen) == step_cost(_decode(3), SHIPPED, qwen)
    shard = LLAMA.shard(2)
    assert step_cost(_decode(3), prof, shard) == step_cost(_decode(3), SHIPPED, shard)


def test_a_fast_forwarded_plan_scales_every_step_and_its_first_steps():
    prof = _with_factors({"llama-3.1-8b": {"granikv": {"decode 1-4": 1.1}}})
    plan = _decode(2, steps=40)
    ex, ref = CostExecutor(prof, LLAMA), CostExecutor(SHIPPED, LLAMA)
    got, base = ex.execute(plan), ref.execute(plan)
    assert got.duration_s == pytest.approx(1.1 * base.duration_s, rel=1e-12)
    assert got.step_durations == pytest.approx([1.1 * d for d in base.step_durations], rel=1e-12)
    cut = replace(plan, num_steps=7)  # the loop prices the block, then its first steps when an arrival cuts it
    object.__setattr__(cut, "requests", plan.requests)
    assert ex.execute(cut).duration_s == pytest.approx(1.1 * ref.execute(cut).duration_s, rel=1e-12)


BASE = json.loads((PROFILE_DIR / "h200-engine.json").read_text())
SRC = {"kind": "measured", "date": "2026-12-05", "command": "granisim validation step-classes RUN"}


@pytest.mark.parametrize("factors, field, value", [
    ({"llama-9b": {"granikv": {"decode 1-4": 1.0}}}, "step_classes.factors.llama-9b", "llama-9b"),
    ({"llama-3.1-8b": {"paged": {"decode 1-4": 1.0}}}, "step_classes.factors.llama-3.1-8b.paged", "paged"),
    ({"llama-3.1-8b": {"token": {"decode 2-3": 1.0}}}, "step_classes.factors.llama-3.1-8b.token.decode 2-3",
     "decode 2-3"),
    ({"llama-3.1-8b": {"token": {"decode 1-4": 3.0}}}, "step_classes.factors.llama-3.1-8b.token.decode 1-4", "3.0"),
    ({"llama-3.1-8b": {"token": {"decode 1-4": "fast"}}}, "step_classes.factors.llama-3.1-8b.token.decode 1-4",
     "fast"),
])
def test_a_bad_section_names_file_field_value(tmp_path, factors, field, value):
    doc = copy.deepcopy(BASE)
    doc["step_classes"] = {"factors": factors, "source": SRC}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ProfileError) as e:
        load_profile(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and f"field {field}" in msg and value in msg


def test_a_good_section_loads_and_is_described(tmp_path):
    doc = copy.deepcopy(BASE)
    doc["step_classes"] = {"factors": {"qwen-2.5-14b": {"paged16": {"prefill <=8191 x2 fresh": 1.08}}}, "source": SRC}
    p = tmp_path / "good.json"
    p.write_text(json.dumps(doc))
    prof = load_profile(p)
    assert prof.step_classes.for_model("qwen-2.5-14b")["paged16"]["prefill <=8191 x2 fresh"] == 1.08
    assert prof.step_classes.for_model("llama-3.1-8b") is None
    assert "step_classes: 1 factors for qwen-2.5-14b" in prof.describe()


@pytest.mark.parametrize("name,base", [("h200-engine-steps", "h200-engine"), ("h100-engine-steps", "h100-engine")])
def test_a_shipped_step_class_profile_is_its_engine_profile_times_its_factors(name, base):
    """Made from its GPU's engine profile and nothing else: a step of a class with a factor costs the factor times
    the engine profile's price."""
    raw = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    assert raw["base"]["profile"] == base and not raw.get("coefficients")
    prof, eng = get_profile(name), get_profile(base)
    factor = prof.step_classes.factors["llama-3.1-8b"]["granikv"]["decode 1-4"]
    assert step_cost(_decode(3), prof, LLAMA).duration_s == pytest.approx(
        factor * step_cost(_decode(3), eng, LLAMA).duration_s, rel=1e-12)
