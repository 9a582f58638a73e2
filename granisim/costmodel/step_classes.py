"""Step-class corrections: the real engine's time over the cost model's price, per model, policy and class of step.

Which class of step a plan is (pure): a decode step by its batch (``decode 1-4``, ``decode 5-16``, ``decode 17-64``,
``decode 65+`` requests), a step with prefill work by its new tokens (``<=512``, ``<=2048``, ``<=8191``, ``>=8192``:
the engine runs steps over 2048 tokens eagerly, and 8192 is the default token budget of a step, a full prefill
chunk), by how many requests prefill in it (``x1``, ``x2``, ``x3``, ``x4+``) and by
whether one of them prefills from scratch (``fresh``: no cached context, its attention reads only its own tokens) or
every one over cached context (``cached``: a prefix hit or an earlier chunk), e.g. ``prefill <=8191 x2 fresh``.

A profile's optional ``step_classes`` section holds a factor per (model, policy, class), fitted on real-engine
validation runs (``granisim validation step-classes``). The price of a plan of a listed model and policy is
multiplied by its class's factor, its breakdown with it; unlisted models, policies and classes, tensor-parallel
shards and host-tier copies are priced as before. Why per class: re-simulated with each class's mean error removed,
the validation units' tails come within 1-2% of the engine's (reports/validation/README.md), while correcting one
class alone can move them the wrong way.
"""
from __future__ import annotations

import re
from typing import Mapping

from granisim.core.contract import BatchPlan, StepResult
from granisim.core.planned import columns
from granisim.costmodel.scaled import scaled

DECODE_BINS = ((4, "decode 1-4"), (16, "decode 5-16"), (64, "decode 17-64"))
DECODE_LAST = "decode 65+"
TOKEN_BINS = ((512, "<=512"), (2048, "<=2048"), (8191, "<=8191"))
TOKEN_LAST = ">=8192"


def _all_classes() -> tuple[str, ...]:
    out = [label for _, label in DECODE_BINS] + [DECODE_LAST]
    for tokens in [label for _, label in TOKEN_BINS] + [TOKEN_LAST]:
        for n in ("x1", "x2", "x3", "x4+"):
            out += [f"prefill {tokens} {n} fresh", f"prefill {tokens} {n} cached"]
    return tuple(out)


CLASSES = _all_classes()


def classify(num_tokens: int, batch: int, prefill_requests: int, fresh: bool) -> str:
    """The class of a step of ``num_tokens`` new tokens over ``batch`` requests, ``prefill_requests`` of them
    prefilling, ``fresh`` if one of those has no cached context (pure)."""
    if prefill_requests == 0:
        return next((label for hi, label in DECODE_BINS if batch <= hi), DECODE_LAST)
    tokens = next((label for hi, label in TOKEN_BINS if num_tokens <= hi), TOKEN_LAST)
    n = f"x{prefill_requests}" if prefill_requests < 4 else "x4+"
    return f"prefill {tokens} {n} {'fresh' if fresh else 'cached'}"


def plan_class(plan: BatchPlan) -> str:
    """The class of one of ``plan``'s steps (a fast-forwarded plan's steps are all decode steps of one batch)."""
    cols = columns(plan.requests)
    prefill_ctx = [ctx for ctx, pre in zip(cols.context_len, cols.is_prefill) if pre]
    return classify(sum(cols.num_new), len(cols), len(prefill_ctx), 0 in prefill_ctx)


POLICY_KEY = re.compile(r"granikv|token|paged[1-9][0-9]*")


def policy_key(plan: BatchPlan) -> str:
    """The policy as validation units name it: ``granikv``, ``token``, ``paged16`` (paged with its page size)."""
    return f"paged{plan.page_size}" if plan.policy == "paged" else plan.policy


def corrected(by_policy: Mapping[str, Mapping[str, float]], plan: BatchPlan, result: StepResult) -> StepResult:
    """``result`` (the plan's compute, before host-tier copies) times its class's factor, where one is listed."""
    f = by_policy.get(policy_key(plan))
    if not f:
        return result
    factor = f.get(plan_class(plan), 1.0)
    return result if factor == 1.0 else scaled(result, factor)
