"""The simulator's executor: a batch plan's predicted duration from the cost model."""

from __future__ import annotations

from pathlib import Path

from granisim.costmodel import cost_tables, finished
from granisim.costmodel.host_build import repeats, with_rebuild
from granisim.costmodel.step import StepBlock
from granisim.config.hardware import HardwareProfile, get_profile
from granisim.config.models import ModelShape, get_model
from granisim.core.contract import BatchPlan, StepResult


class CostExecutor:
    """Implements :class:`granisim.core.contract.Executor` with :func:`granisim.costmodel.step_cost`.

    Needs no KV layouts (plans may leave ``new_slots``/``input_tokens``/``layout`` empty) and
    accepts decode fast-forward plans of any ``num_steps``. ``next_tokens`` is None (synthetic).
    """

    needs_layouts = False
    max_steps_per_plan = 1 << 30

    def __init__(self, profile: HardwareProfile | str | Path, model: ModelShape | str):
        self.profile = profile if isinstance(profile, HardwareProfile) else get_profile(profile)
        self.model = model if isinstance(model, ModelShape) else get_model(model)
        self._tables = cost_tables(self.profile, self.model)
        # the last fast-forwarded plan priced, its blocks of steps and its first step's full-build time
        self._block: tuple[BatchPlan, StepBlock, float] | None = None
        self._previous: BatchPlan | None = None  # the plan before (profiles with overhead.rebuild_s only)

    def execute(self, plan: BatchPlan) -> StepResult:
        if plan.num_steps <= 1:  # plan_cost(self._tables, plan, self.profile, previous), fewer calls
            result = self._tables.step_block(plan)[0]
            rebuild = self._rebuild(plan) if self._tables.rebuild else 0.0
        else:
            # the serving loop prices a fast-forward block, then its first steps when an event cuts it short:
            # those are the block's first steps (StepBlock), not priced again
            last = self._block
            if last is not None and _fewer_steps_of(plan, last[0]):
                result, rebuild = last[1].first(plan.num_steps), last[2]
            else:
                result, block = self._tables.step_block(plan)
                rebuild = self._rebuild(plan) if self._tables.rebuild else 0.0
                self._block = (plan, block, rebuild)
        if rebuild:
            result = with_rebuild(result, rebuild)
        return finished(self._tables, plan, result, self.profile)

    def _rebuild(self, plan: BatchPlan) -> float:
        """The host time of building ``plan``'s step in full, 0 if the engine derives it from the plan before."""
        previous, self._previous = self._previous, plan
        return 0.0 if repeats(previous, plan) else self._tables.rebuild


def _fewer_steps_of(plan: BatchPlan, block: BatchPlan) -> bool:
    """``plan`` is ``block`` (the same objects: ``with_steps``) standing for fewer steps."""
    return (plan.num_steps < block.num_steps and plan.requests is block.requests and plan.step == block.step
            and plan.groups is block.groups and plan.copies is block.copies and plan.transfers is block.transfers
            and plan.policy == block.policy and plan.page_size == block.page_size)


def for_setup(setup):
    """The cost executor of a prepared scenario: its profile and model, every step's time times the scenario's
    ``hardware.step_time_scale`` where that is not 1 (a sensitivity what-if, granisim.costmodel.scaled)."""
    ex = CostExecutor(setup.profile, setup.model)
    scale = setup.scenario.hardware.step_time_scale
    if scale == 1.0:
        return ex
    from granisim.costmodel.scaled import ScaledExecutor

    return ScaledExecutor(ex, scale)
