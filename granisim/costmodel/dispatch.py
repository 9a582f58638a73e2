"""Cost-model dispatch with a third choice: no prefix pass at all (``policy.dispatch = "auto"``).

``dispatch = "cost"`` picks between the two prefix passes (dense, cascade). With many small
groups over short prefixes a prefix pass of either kind can cost more than it saves: its
launches, split-KV partials and the LSE merge against re-reading a short prefix once per
member (what the baseline engines do). ``"auto"`` also considers that path — ``paged``
for the group: every member reads its whole context, the shared part at the group's
storage efficiency — and takes whichever the cost model predicts cheapest.

The comparison runs the cost model itself (:func:`granisim.costmodel.step_cost`) on a
synthetic decode step holding just this group — ``b`` members with ``L`` shared and
``private`` own tokens each — once per path. Group sizes and private lengths are bucketed
(geometric, 2^(1/4) and 2x) and the answers memoised, so a simulation evaluates only a few
hundred synthetic steps.

A group judged alone pays a whole prefix launch and its host work, which in a real step all
groups of one (path, storage) share (one stacked launch). So the scheduler then prices the
whole step three ways — the per-group choices, every group without a prefix pass, every
group with its best prefix pass — and keeps the cheapest (:func:`step_seconds`).
"""

from __future__ import annotations

import math

from granisim.costmodel import step_cost
from granisim.config.hardware import HardwareProfile
from granisim.config.models import ModelShape
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup

_MEMO: dict[tuple, str] = {}


def _bucket_b(b: int) -> int:
    """Group sizes up to 16 exactly, then on a 2^(1/4) grid (the value the grid point stands for)."""
    if b <= 16:
        return b
    return int(round(2 ** (round(4 * math.log2(b)) / 4)))


def _bucket_private(n: int) -> int:
    return 0 if n <= 0 else 1 << max(0, math.ceil(math.log2(n)))


def group_step_costs(profile: HardwareProfile, model: ModelShape, prefix_len: int, b: int, storage: str,
                     private_len: int, page_size: int = 1) -> dict[str, float]:
    """Predicted seconds of a decode step holding one group of ``b`` members, per path."""
    reqs = tuple(PlannedRequest(i, prefix_len + private_len, 1, False, 0, prefix_len) for i in range(b))
    paths = ["paged", "cascade"] + (["dense"] if storage == "slab" else [])
    out = {}
    for path in paths:
        g = PrefixGroup(0, prefix_len, storage, path, tuple(range(b)), b * model.group_size)
        plan = BatchPlan(0, "granikv", page_size, reqs, (g,))
        out[path] = step_cost(plan, profile, model).duration_s
    return out


def cheapest_group_path(profile: HardwareProfile, model: ModelShape, prefix_len: int, b: int, storage: str,
                        private_len: int, page_size: int = 1, allow_paged: bool = True) -> str:
    """'dense', 'cascade' or (if ``allow_paged``) 'paged' (no prefix pass), whichever the cost model
    predicts cheapest."""
    bb, pb = _bucket_b(b), _bucket_private(private_len)
    key = (id(profile), model.name, model.tp, model.expert_routing, model.expert_zipf_s, prefix_len, bb, storage, pb,
           page_size, allow_paged)  # tp shards of a model share its name
    path = _MEMO.get(key)
    if path is None:
        costs = group_step_costs(profile, model, prefix_len, bb, storage, pb, page_size)
        if not allow_paged:
            costs.pop("paged")
        path = min(costs, key=lambda p: (costs[p], p != "cascade"))  # ties: cascade
        if len(_MEMO) > 200_000:
            _MEMO.clear()
        _MEMO[key] = path
    return path


def step_seconds(profile: HardwareProfile, model: ModelShape, plan: BatchPlan) -> float:
    """Predicted seconds of one step as planned (the scheduler's whole-step comparison)."""
    return step_cost(plan, profile, model).duration_s
