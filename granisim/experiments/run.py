"""From a scenario to results on disk: setup (model, profile, KV budget), run, outputs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import pandas as pd

from granisim.config.files import unreadable
from granisim.config.hardware import HardwareProfile, get_profile
from granisim.core.metrics import requests_frame, summarize, summary_json
from granisim.config.models import ModelShape, get_model, kv_budget_tokens
from granisim.config.replica import replica_m_sat, replica_shard
from granisim.config.scenario import MAX_CLOCK_S, MAX_TIME_S, Scenario, ScenarioError
from granisim.core.heap import SIMULATION, fewer_collections, release_free_heap
from granisim.core.workload import LENGTHS_TRACES, load_lengths, load_trace, scaled_lengths
from granisim.kv.host_tier import host_tier_config


@dataclass(frozen=True)
class Setup:
    scenario: Scenario
    model: ModelShape
    profile: HardwareProfile
    kv_budget: int
    m_sat: int
    trace: pd.DataFrame
    path_chooser: Callable[[int, int, str], str] | None
    step_pricer: Callable[[object], float] | None = None  # dispatch = "auto": predicted seconds of a plan
    source: str = "<scenario>"  # the scenario's file, for errors found while it runs


def prepare(scenario: Scenario, source: str = "<scenario>") -> Setup:
    """Resolve names and files; a user mistake raises ScenarioError naming file, field, value."""
    try:
        model = get_model(scenario.model.name)
    except ValueError as err:
        raise ScenarioError(f"{source}: field model.name = {scenario.model.name!r}: {err}") from None
    try:
        profile = get_profile(scenario.hardware.profile)
    except ValueError as err:
        raise ScenarioError(f"{source}: field hardware.profile = {scenario.hardware.profile!r}: {err}") from None
    model = replica_shard(model, scenario, profile, source)  # tp > 1: one GPU's shard; MoE: its routing
    hw = scenario.hardware
    budget = hw.kv_budget_tokens or kv_budget_tokens(model, profile.memory_bytes, hw.mem_fraction,
                                                     hw.reserve_gb * 1e9)
    if hw.kv_budget_tokens and hw.kv_budget_tokens * model.kv_bytes_per_token > profile.memory_bytes:
        raise ScenarioError(
            f"{source}: field hardware.kv_budget_tokens = {hw.kv_budget_tokens}: a KV cache of that many tokens "
            f"needs {hw.kv_budget_tokens * model.kv_bytes_per_token / 1e9:.0f} GB, more than the "
            f"{profile.memory_bytes / 1e9:.0f} GB of {profile.name}")
    if budget > MAX_KV_TOKENS:  # the allocator holds one integer id per KV slot
        raise ScenarioError(f"{source}: {_budget_field(hw, budget)} is more than the {MAX_KV_TOKENS:,} KV slots "
                            f"the simulator tracks on one GPU (profile memory_bytes = {profile.memory_bytes:.4g})")
    try:  # the allocator builds the tier later: a tier it cannot track is the scenario's error, said now
        host_tier_config(scenario, model)
    except ValueError as err:
        raise ScenarioError(f"{source}: {err}") from None
    if budget <= 0:
        # blame the field that made it so: the weights alone do not fit, or the reserve takes the rest
        weights_fit = profile.memory_bytes * hw.mem_fraction > model.weight_bytes
        field, value = ("hardware.reserve_gb", hw.reserve_gb) if weights_fit else ("hardware.mem_fraction",
                                                                                   hw.mem_fraction)
        raise ScenarioError(
            f"{source}: field {field} = {value}: no memory left for the KV cache "
            f"({profile.memory_bytes / 1e9:.0f} GB x {hw.mem_fraction} - {model.weight_bytes / 1e9:.1f} GB weights "
            f"- {hw.reserve_gb} GB reserve)")
    wl = scenario.workload
    try:
        trace = load_trace(wl.trace)
    except OSError as err:
        hint = (f"file not found ({wl.trace!r} is a shipped lengths trace, without arrival times: "
                f"workload.lengths_trace = {wl.trace!r})" if wl.trace in LENGTHS_TRACES else "file not found")
        raise ScenarioError(f"{source}: field workload.trace = {wl.trace!r}: {unreadable(err, hint)}") from None
    except ValueError as err:
        raise ScenarioError(f"{source}: field workload.trace = {wl.trace!r}: {err}") from None
    if (wl.kind == "azure" or wl.arrivals == "trace") and wl.num_requests > len(trace):
        # one request per trace row, in order: more requests than rows is an error, not a silent cut
        raise ScenarioError(f"{source}: field workload.num_requests = {wl.num_requests}: the trace has only "
                            f"{len(trace)} rows and replays one request per row (kind = 'azure' or arrivals = "
                            f"'trace'); use num_requests <= {len(trace)}, or 0 for every row")
    _check_scaled_lengths(wl, trace, source)
    _check_time_span(wl, trace, source)
    shared, own = (wl.prefix_len if wl.kind != "azure" else 0), _smallest_own_tokens(wl, trace)
    if shared + 2 > budget:
        raise ScenarioError(f"{source}: {_budget_field(hw, budget)} is too small for one request "
                            f"(workload.prefix_len = {wl.prefix_len} alone needs more)")
    if shared + own > budget:  # every request would be rejected
        raise ScenarioError(f"{source}: {_budget_field(hw, budget)} is too small for any request: the smallest "
                            f"needs {shared + own} (workload.prefix_len = {wl.prefix_len}, then {own} of its own: "
                            f"the trace's shortest prompt and output, scaled)")
    _check_pool_split(scenario, budget, shared + own, own, source)
    m_sat = scenario.policy.m_sat or replica_m_sat(profile, scenario.hardware.tp)
    chooser = pricer = None
    if scenario.policy.dispatch == "cost":
        from granisim.costmodel import cheaper_path

        chooser = partial(cheaper_path, profile, model)  # (prefix_len, b, storage)
    elif scenario.policy.dispatch == "auto":
        from granisim.costmodel.dispatch import cheapest_group_path, step_seconds

        chooser = partial(cheapest_group_path, profile, model)  # (prefix_len, b, storage, private_len, ...)
        pricer = partial(step_seconds, profile, model)  # (plan)
    return Setup(scenario, model, profile, budget, m_sat, trace, chooser, pricer, source)


MAX_KV_TOKENS = 2**30  # KV slots one simulated GPU may have (their ids take 8 GB); the tiny test model on a b200: 332M


def _budget_field(hw, budget: int) -> str:
    """The field that set the KV budget, for an error about it."""
    if hw.kv_budget_tokens:
        return f"field hardware.kv_budget_tokens = {hw.kv_budget_tokens}"
    return (f"field hardware.profile = {hw.profile!r}: the KV budget of {budget:,} tokens its memory leaves "
            f"(hardware.mem_fraction = {hw.mem_fraction}, hardware.reserve_gb = {hw.reserve_gb})")


MAX_SCALED_LEN = 2**53  # a scaled prompt or output length at or beyond this is a mistake (and overflows int64 above)


def _check_scaled_lengths(wl, trace: pd.DataFrame, source: str) -> None:
    """A length scale that makes the trace's longest prompt, follow-up message or output
    ``MAX_SCALED_LEN`` tokens or more: a ScenarioError naming the scale (the lengths are integers)."""
    lengths = load_lengths(wl.lengths_trace) if wl.lengths_trace else trace
    longest_prompt, longest_output = int(lengths.num_prefill_tokens.max()), int(lengths.num_decode_tokens.max())
    checks = [("workload.suffix_scale", wl.suffix_scale, longest_prompt * wl.suffix_scale, "prompt"),
              ("workload.output_scale", wl.output_scale, longest_output * wl.output_scale, "output")]
    if wl.turns > 1:
        checks.append(("workload.followup_scale", wl.followup_scale,
                       longest_prompt * wl.suffix_scale * wl.followup_scale, "follow-up message"))
    for field, scale, longest, what in checks:
        if longest >= MAX_SCALED_LEN:
            raise ScenarioError(f"{source}: field {field} = {scale!r}: makes the trace's longest {what} "
                                f"{longest:.3g} tokens; a length must stay below 2^53")


def _check_time_span(wl, trace: pd.DataFrame, source: str) -> None:
    """Arrivals spread over ``MAX_TIME_S`` or more (a tiny rate, a trace's timestamps or a small time scale): a
    ScenarioError naming the field. Beyond it float seconds no longer resolve a step, so latencies would come out
    0 or NaN."""
    n = wl.num_requests or len(trace)
    if wl.kind == "azure" or wl.arrivals == "trace":
        times = trace["arrived_at"].to_numpy()[:n]
        span = (times[-1] - times[0]) / wl.time_scale
        if span >= MAX_TIME_S:
            field, value = (("workload.time_scale", wl.time_scale) if wl.time_scale != 1.0
                            else ("workload.trace", repr(wl.trace)))
            raise ScenarioError(f"{source}: field {field} = {value}: the {n} replayed arrivals span {span:.3g} s; "
                                f"a run must span less than 2^30 s (about 34 years)")
    elif not n / wl.rate < MAX_TIME_S:  # also inf: a rate near the float minimum
        raise ScenarioError(f"{source}: field workload.rate = {wl.rate!r}: {n} Poisson arrivals at this rate span "
                            f"about {n / wl.rate:.3g} s; a run must span less than 2^30 s (about 34 years)")


def _smallest_own_tokens(wl, trace: pd.DataFrame) -> int:
    """The fewest KV tokens of a request's own (prompt suffix and output, as scaled and capped; no shared prefix)
    over the rows its lengths come from: a lower bound for every request."""
    prompt, out = scaled_lengths(load_lengths(wl.lengths_trace) if wl.lengths_trace else trace, wl)
    return int((prompt + out).min())


def _check_pool_split(scenario: Scenario, budget: int, one: int, own: int, source: str) -> None:
    """A policy whose split of the budget leaves no room for even the smallest request (``one`` tokens, ``own`` of
    them its own rather than a shared prefix) would reject every request: a ScenarioError naming the field
    instead."""
    pol = scenario.policy
    if pol.name.startswith("paged"):
        page = int(pol.name[5:]) if pol.name[5:] else pol.page_size
        pages, need = budget // page, -(-one // page)
        if need > pages:
            field, value = ("policy.page_size", page) if pol.name == "paged" else ("policy.name", repr(pol.name))
            raise ScenarioError(f"{source}: field {field} = {value}: the KV budget of {budget} tokens holds {pages} "
                                f"page(s) of {page} tokens; one request needs at least {need}")
    elif pol.name == "granikv" and pol.hot_fraction != "adaptive" and budget - int(budget * pol.hot_fraction) < own:
        raise ScenarioError(f"{source}: field policy.hot_fraction = {pol.hot_fraction}: leaves the COLD pool "
                            f"{budget - int(budget * pol.hot_fraction)} of {budget} tokens, too few for any "
                            f"request's own tokens (the smallest has {own}; use a smaller value, or 'adaptive')")
    elif (pol.name == "granikv" and pol.hot_fraction != "adaptive" and pol.hot_fraction > 0
          and int(budget * pol.hot_fraction) == 0 and scenario.hardware.host_kv_gb and pol.host_tier_mode == "slabs"):
        # as hot_fraction = 0 (refused with the scenario): a tier of HOT slabs with no HOT pool would move nothing
        raise ScenarioError(f"{source}: field policy.hot_fraction = {pol.hot_fraction}: a HOT pool of 0 of {budget} "
                            f"tokens leaves no HOT slabs to move to host (hardware.host_kv_gb = "
                            f"{scenario.hardware.host_kv_gb}, policy.host_tier = 'slabs'"
                            f"{'' if pol.host_tier else ', its default for granikv'}); use a larger hot_fraction "
                            f"or host_tier = 'slabs+pages'")


def simulate(setup: Setup, executor=None, progress: bool = True):
    """Run the scenario (with fewer garbage collections: granisim.core.heap); the memory the run freed goes back
    to the system before the frames are built."""
    with fewer_collections(**SIMULATION):
        if setup.scenario.fleet is not None:  # N replicas behind a router (granisim.fleet)
            from granisim.fleet.build import simulate_setup

            result = simulate_setup(setup, executor, progress)
        else:
            from granisim.core.serving_loop import ServingLoop
            from granisim.costmodel.executor import for_setup

            result = ServingLoop(setup, executor or for_setup(setup), progress=progress).run()
    release_free_heap()
    if not result.end_s < MAX_CLOCK_S:  # NaN too: latencies would come out NaN or 0
        wl = setup.scenario.workload
        field, value, why = ("hardware.profile", repr(setup.profile.name), "the profile prices steps far too long")
        if wl.think_time_s * (wl.turns - 1) >= MAX_TIME_S:
            field, value, why = ("workload.think_time_s", wl.think_time_s, f"{wl.turns} turns' think times add up")
        raise ScenarioError(f"{setup.source}: field {field} = {value}: the simulated clock reached "
                            f"{result.end_s:.3g} s, beyond 2^33 s, where float seconds no longer resolve a step "
                            f"({why})")
    return result


def write_outputs(setup: Setup, result, out: Path, plots: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    reqs = requests_frame(result.records)
    steps = result.steps.frame()
    summary = summarize(reqs, steps, result.end_s)
    summary.update(policy=setup.scenario.policy.name, model=setup.model.name, profile=setup.profile.name,
                   kv_budget_tokens=setup.kv_budget, m_sat=setup.m_sat, seed=setup.scenario.seed)
    reqs.to_parquet(out / "requests.parquet", index=False)
    steps.to_parquet(out / "steps.parquet", index=False)
    (out / "summary.json").write_text(summary_json(summary))
    if plots:
        from granisim.experiments.plots import perfetto_trace, plot_run

        plot_run(reqs, steps, out, title=f"{setup.scenario.name} ({setup.scenario.policy.name})")
        perfetto_trace(steps, out / "trace.json", reqs)
    return summary
