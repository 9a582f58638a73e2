"""Pricing of host-tier KV copies (a plan's ``transfers``, granisim/kv/host_tier.py). Pure functions.

One copy: ``host.copy_launch_s + bytes / host.link_bandwidth`` when contiguous (a HOT slab), else
``pieces * host.page_copy_s + bytes / host.page_bandwidth_<direction>`` (page-granular gathers; a page
bandwidth of 0 stands for the link's). Each direction's copies run one after another; the two
directions overlap by ``host.duplex`` (1: the link's two directions at once, the slower one sets the
time; 0: one copy stream for both, their sum). Up to ``host.overlap`` of the step's compute hides the
copy stream; the rest lengthens the step (breakdown key ``host_copy``).
"""

from __future__ import annotations

from dataclasses import replace

from granisim.config.coefficients import HardwareProfile
from granisim.core.contract import BatchPlan, StepResult


def copy_seconds(nbytes: int, contiguous: bool, pieces: int, profile: HardwareProfile,
                 direction: str = "to_gpu") -> float:
    """One copy's time on the link."""
    if contiguous:
        return profile["host.copy_launch_s"] + nbytes / profile["host.link_bandwidth"]
    bw = profile[f"host.page_bandwidth_{direction}"] or profile["host.link_bandwidth"]
    return pieces * profile["host.page_copy_s"] + nbytes / bw


def copy_stream_seconds(transfers, profile: HardwareProfile) -> float:
    """The copy stream's time: the slower direction, plus the faster one's share that does not overlap."""
    per = {"to_gpu": 0.0, "to_host": 0.0}
    for t in transfers:
        per[t.direction] += copy_seconds(t.nbytes, t.contiguous, t.pieces, profile, t.direction)
    slow, fast = max(per.values()), min(per.values())
    return slow + (1.0 - profile["host.duplex"]) * fast


def exposed_seconds(copy_s: float, compute_s: float, profile: HardwareProfile) -> float:
    """What the copies add to a step of ``compute_s`` seconds."""
    return max(0.0, copy_s - profile["host.overlap"] * compute_s)


def with_transfers(plan: BatchPlan, result: StepResult, profile: HardwareProfile) -> StepResult:
    """``result`` lengthened by the plan's copies that compute does not hide (unchanged without any)."""
    if not plan.transfers:
        return result
    extra = exposed_seconds(copy_stream_seconds(plan.transfers, profile), result.duration_s, profile)
    breakdown = dict(result.breakdown)
    breakdown["host_copy"] = breakdown.get("host_copy", 0.0) + extra
    steps = result.step_durations
    if steps:
        steps = (steps[0] + extra, *steps[1:])
    return replace(result, duration_s=result.duration_s + extra, breakdown=breakdown, step_durations=steps)
