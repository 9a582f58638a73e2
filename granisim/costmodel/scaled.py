"""An executor whose every step takes ``factor`` times another executor's time: the step-time error a user
wants the predictions' sensitivity to (``granisim run --sensitivity``)."""

from __future__ import annotations

from granisim.core.contract import BatchPlan, Executor, StepResult, step_result


class ScaledExecutor:
    """Implements :class:`granisim.core.contract.Executor`: ``inner``'s results with every duration (the plan's,
    each fast-forwarded step's and each breakdown key's) times ``factor``."""

    def __init__(self, inner: Executor, factor: float):
        if not factor > 0:
            raise ValueError(f"step-time factor {factor!r}: give a number > 0")
        self.inner, self.factor = inner, float(factor)
        self.needs_layouts = inner.needs_layouts
        self.max_steps_per_plan = inner.max_steps_per_plan

    def execute(self, plan: BatchPlan) -> StepResult:
        return scaled(self.inner.execute(plan), self.factor)


def scaled(result: StepResult, factor: float) -> StepResult:
    """``result`` with its duration, each fast-forwarded step and each breakdown key times ``factor``."""
    steps = tuple(d * factor for d in result.step_durations) if result.step_durations is not None else None
    return step_result(result.duration_s * factor, {k: v * factor for k, v in result.breakdown.items()},
                       result.next_tokens, steps)
