"""The simulator's executor: a batch plan's predicted duration from the cost model."""

from __future__ import annotations

from pathlib import Path

from granisim.costmodel import cost_tables, plan_cost
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

    def execute(self, plan: BatchPlan) -> StepResult:
        return plan_cost(self._tables, plan, self.profile)
