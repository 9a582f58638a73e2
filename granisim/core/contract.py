"""The contract between the scheduler and an executor: a frozen batch plan in, a step result out.

Both executors — :class:`granisim.costmodel.executor.CostExecutor` (predicted seconds) and
``gpu_backend``'s real engine (measured seconds) — consume exactly these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np

from granisim.frozen import slot_setters
from granisim.kv.host_tier import KVTransfer
from granisim.kv.hot_pool import KVCopy
from granisim.kv.layout import RequestLayout

PATHS = ("paged", "cascade", "dense")


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request's work in a step.

    ``context_len`` tokens are already in the KV cache; ``num_new`` tokens are computed
    now (a prefill chunk, or 1 for decode) and their K/V written to ``new_slots``.
    ``group`` indexes ``BatchPlan.groups`` (-1: none); when grouped, the first
    ``shared_len`` context tokens are read by the group's prefix pass, the rest by the
    request's own (suffix) pass.
    """

    rid: int
    context_len: int
    num_new: int
    is_prefill: bool
    group: int = -1
    shared_len: int = 0
    new_slots: np.ndarray | None = None  # slots for the new tokens' K/V (executors that move data)
    input_tokens: np.ndarray | None = None  # token ids fed this step (prefill chunk / last sampled token)
    layout: RequestLayout | None = None  # full KV layout incl. the new tokens (executors that move data)

    @property
    def kv_len(self) -> int:
        return self.context_len + self.num_new


_new = object.__new__


PLANNED_SETTERS = _SET = slot_setters(PlannedRequest)


def planned_request(rid: int, context_len: int, num_new: int, is_prefill: bool, group: int = -1,
                    shared_len: int = 0, new_slots=None, input_tokens=None, layout=None) -> PlannedRequest:
    """``PlannedRequest(...)`` (an equal object), built without the frozen dataclass's per-field
    ``object.__setattr__`` calls: the batch builder makes one per request per plan."""
    o = _new(PlannedRequest)
    a, b, c, d, e, f, g, h, i = _SET
    a(o, rid)
    b(o, context_len)
    c(o, num_new)
    d(o, is_prefill)
    e(o, group)
    f(o, shared_len)
    g(o, new_slots)
    h(o, input_tokens)
    i(o, layout)
    return o


@dataclass(frozen=True, slots=True)
class PrefixGroup:
    """Decode requests whose context starts with the same cached prefix (radix node ``key``)."""

    key: int
    prefix_len: int
    storage: str  # 'slab' (one contiguous HOT run) or the pool name ('cold', 'token', 'paged')
    path: str  # 'dense' | 'cascade' | 'paged' (paged = no prefix pass: each request re-reads)
    members: tuple[int, ...]  # indices into BatchPlan.requests
    m_eff: int  # len(members) * G


_GROUP_SET = slot_setters(PrefixGroup)


def prefix_group(key: int, prefix_len: int, storage: str, path: str, members: tuple[int, ...],
                 m_eff: int) -> PrefixGroup:
    """``PrefixGroup(...)`` (an equal object) without the frozen ``__init__``: the batch builder makes one per
    group per plan."""
    o = _new(PrefixGroup)
    a, b, c, d, e, f = _GROUP_SET
    a(o, key)
    b(o, prefix_len)
    c(o, storage)
    d(o, path)
    e(o, members)
    f(o, m_eff)
    return o


@dataclass(frozen=True, slots=True)
class BatchPlan:
    step: int
    policy: str
    page_size: int
    requests: tuple[PlannedRequest, ...]
    groups: tuple[PrefixGroup, ...] = ()
    copies: tuple[KVCopy, ...] = ()
    # Decode fast-forward: this many identical decode steps in a row (every request is a
    # decode request, each step adds one token to every context). Only the cost executor
    # accepts > 1; results then cover all steps.
    num_steps: int = 1
    # host-tier copies (granisim.kv.host_tier), in the order the allocator made them: 'to_host' before the
    # step, 'to_gpu' on a copy stream ahead of the layers that read them; () without a host tier
    transfers: tuple[KVTransfer, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new for r in self.requests)


_PLAN_SET = slot_setters(BatchPlan)


def batch_plan(step: int, policy: str, page_size: int, requests, groups: tuple = (), copies: tuple = (),
               num_steps: int = 1, transfers: tuple = ()) -> BatchPlan:
    """``BatchPlan(...)`` (an equal object), built as :func:`planned_request` builds its object: the
    batch builder makes one per plan and ``with_steps`` one or two per fast-forwarded plan."""
    o = _new(BatchPlan)
    a, b, c, d, e, f, g, h = _PLAN_SET
    a(o, step)
    b(o, policy)
    c(o, page_size)
    d(o, requests)
    e(o, groups)
    f(o, copies)
    g(o, num_steps)
    h(o, transfers)
    return o


def with_steps(plan: BatchPlan, num_steps: int) -> BatchPlan:
    """``dataclasses.replace(plan, num_steps=num_steps)``, without its per-field introspection (the
    serving loop makes one or two per fast-forwarded plan)."""
    return batch_plan(plan.step, plan.policy, plan.page_size, plan.requests, plan.groups, plan.copies, num_steps,
                      plan.transfers)


@dataclass(frozen=True, slots=True)
class StepResult:
    duration_s: float  # all ``num_steps`` steps together
    breakdown: Mapping[str, float] = field(default_factory=dict)  # seconds per cost key
    next_tokens: Mapping[int, int] | None = None  # rid -> sampled token (real engine); None: synthetic
    step_durations: tuple[float, ...] | None = None  # per step when num_steps > 1


_RESULT_SET = slot_setters(StepResult)


def step_result(duration_s: float, breakdown: Mapping[str, float], next_tokens: Mapping[int, int] | None = None,
                step_durations: tuple[float, ...] | None = None) -> StepResult:
    """``StepResult(...)`` (an equal object) without the frozen ``__init__``: the cost model makes one
    per plan priced."""
    o = _new(StepResult)
    a, b, c, d = _RESULT_SET
    a(o, duration_s)
    b(o, breakdown)
    c(o, next_tokens)
    d(o, step_durations)
    return o


class Executor(Protocol):
    """Turns a batch plan into a step result."""

    needs_layouts: bool  # fill new_slots / input_tokens / layout in plans
    max_steps_per_plan: int  # 1 for executors that run steps one by one

    def execute(self, plan: BatchPlan) -> StepResult: ...
