"""Hand-built scheduler states: a real small allocator, hand-made requests, one step at a time."""

from __future__ import annotations

import numpy as np

from granisim.config.scenario import SchedulerCfg
from granisim.core.contract import BatchPlan, StepResult
from granisim.core.scheduler import Scheduler
from granisim.core.workload import RequestSpec
from granisim.kv import make_allocator


def cfg(**over) -> SchedulerCfg:
    """The scheduler section; no output reserve at admission unless a test asks for one."""
    return SchedulerCfg(**{"new_token_ratio": 0.0, **over})


def prefix_of(role: int, n: int) -> np.ndarray:
    """A role's shared prefix: tokens no suffix uses."""
    return np.arange(n, dtype=np.int64) + 10_000_000 * (role + 1)


def spec(rid: int, prompt: int = 10, out: int = 50, arrival: float = 0.0, role: int = -1,
         prefix: int = 0) -> RequestSpec:
    """``prompt`` private tokens (unique to the request) after an optional ``prefix`` of ``role``."""
    pre = prefix_of(role, prefix) if prefix else np.empty(0, dtype=np.int64)
    suffix = np.arange(prompt, dtype=np.int64) + 1_000 * rid + 1
    return RequestSpec(rid, arrival, pre, suffix, out, prefix, role)


def scheduler(policy: str = "token", capacity: int = 10_000, *, hot_fraction: float = 0.2, group_size: int = 4,
              m_sat: int = 16, dispatch: str = "threshold", **over) -> Scheduler:
    alloc = make_allocator(policy, capacity, hot_fraction=hot_fraction, page_size=1)
    return Scheduler(cfg(**over), alloc, group_size=group_size, m_sat=m_sat, dispatch=dispatch)


def step(s: Scheduler, now: float = 0.0) -> BatchPlan:
    """Plan one step and apply it (a step that takes no time)."""
    plan = s.schedule(now)
    assert plan is not None, "nothing to schedule"
    s.postprocess(plan, StepResult(0.0), now)
    return plan


def rids(plan: BatchPlan) -> list[int]:
    return [p.rid for p in plan.requests]


def new_tokens(plan: BatchPlan) -> dict[int, int]:
    return {p.rid: p.num_new for p in plan.requests}
