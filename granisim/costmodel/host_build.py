"""Whether the real engine builds a step's metadata anew: a pure function of the step's plan and the one before.

The engine derives a decode step that repeats the previous one (same requests in the same order, same groups, one
token further, no KV moved) from that step's metadata, and builds every other step in full
(gpu_backend/executor/rows_repeat.py). A full build costs the host more than a derived one (on an H200 the decode
steps that wrote new table rows, all built in full, had a host part of 0.56-0.94 ms against 0.13-0.29 ms for the
others; reports/validation/README.md, "The engine with its request table"), so an engine-calibrated profile prices
it: ``overhead.rebuild_s`` on every step that does not repeat the one before.
"""
from __future__ import annotations

from granisim.core.contract import BatchPlan, StepResult


def repeats(previous: BatchPlan | None, plan: BatchPlan) -> bool:
    """``plan`` is a decode step the engine derives from ``previous`` (rows_repeat.py's rule, on the plans alone)."""
    if previous is None or plan.copies or plan.transfers or len(plan.requests) != len(previous.requests):
        return False
    if any(r.is_prefill for r in plan.requests) or any(r.is_prefill for r in previous.requests):
        return False
    return (all(a.rid == b.rid for a, b in zip(plan.requests, previous.requests))
            and [(g.path, g.prefix_len, g.members) for g in plan.groups]
            == [(g.path, g.prefix_len, g.members) for g in previous.groups])


def after_each(plans: list[BatchPlan]):
    """(the plan before or None, plan) for each of a run's plans in order: what `repeats` compares."""
    return zip([None, *plans[:-1]], plans)


def with_rebuild(result: StepResult, seconds: float) -> StepResult:
    """``result`` with ``seconds`` more host overhead, on its first step (the one built in full)."""
    parts = dict(result.breakdown)
    parts["overhead"] = parts.get("overhead", 0.0) + seconds
    steps, total = result.step_durations, result.duration_s + seconds
    if steps:  # the block's total stays its steps added left to right, as the engine's clock adds them
        steps, total = (steps[0] + seconds, *steps[1:]), 0.0
        for x in steps:
            total += x
    return StepResult(total, parts, result.next_tokens, steps)
