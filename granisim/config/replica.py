"""The model one GPU of a replica holds: the scenario's model, its MoE routing assumption, its tp shard.

``hardware.tp`` GPUs (of the profile's kind) serve one replica; the cost model and the KV budget see one
GPU's shard (:meth:`granisim.config.models.ModelShape.shard`): KV capacity in tokens is what one GPU holds
after its shard of the weights (every GPU holds its heads' part of every token), i.e. the replica's memory
minus the sharded weights, summed over its GPUs, divided by the replica's bytes per token.
A user mistake raises :class:`granisim.config.scenario.ScenarioError` naming file, field and value.
"""

from __future__ import annotations

from dataclasses import replace

from granisim.config.coefficients import HardwareProfile
from granisim.config.models import ModelShape
from granisim.config.scenario import Scenario, ScenarioError


def replica_shard(model: ModelShape, scenario: Scenario, profile: HardwareProfile, source: str) -> ModelShape:
    """The per-GPU shape a scenario's replica runs (``model`` itself for tp = 1 dense models)."""
    mc, hw = scenario.model, scenario.hardware
    for field in ("expert_routing", "expert_zipf_s"):
        value = getattr(mc, field)
        if value is not None and not model.is_moe:
            raise ScenarioError(f"{source}: field model.{field} = {value!r}: {model.name} is a dense model "
                                f"(no experts); leave the field out")
    if model.is_moe and (mc.expert_routing is not None or mc.expert_zipf_s is not None):
        model = replace(model, expert_routing=mc.expert_routing or "uniform",
                        expert_zipf_s=mc.expert_zipf_s if mc.expert_zipf_s is not None else 1.0)
    tp = hw.tp
    if tp == 1:
        return model
    why = model.shard_error(tp)
    if why is not None:
        raise ScenarioError(f"{source}: field hardware.tp = {tp}: {why}")
    if f"comm.allreduce.tp{tp}.busbw" not in profile.coefficients:
        raise ScenarioError(f"{source}: field hardware.tp = {tp}: profile {profile.name} has no all-reduce "
                            f"coefficients for tp = {tp} (coefficients.comm.allreduce.tp{tp}.*)")
    shard = model.shard(tp)
    usable = profile.memory_bytes * hw.mem_fraction
    if shard.weight_bytes > usable:
        raise ScenarioError(f"{source}: field hardware.tp = {tp}: one GPU's shard of {model.name} holds "
                            f"{shard.weight_bytes / 1e9:.1f} GB of weights, more than {profile.memory_bytes / 1e9:.0f} GB "
                            f"x {hw.mem_fraction} of {profile.name}; use a larger tp")
    return shard


def replica_m_sat(profile: HardwareProfile, tp: int) -> int:
    """The profile's M_sat for GPUs of a tp replica: ``m_sat.tp{tp}`` where the profile has it, else
    ``m_sat x tp``. Per KV head ``M_eff = B x G`` is unchanged by tp, but a GPU holds ``n_kv / tp`` KV heads,
    so the dense prefix pass launches ``tp`` times fewer CTAs and fills the GPU only at larger ``M_eff``:
    the crossover moves up (docs/tp.md)."""
    if tp == 1:
        return profile.m_sat
    c = profile.coefficients.get(f"m_sat.tp{tp}")
    return int(c.value) if c is not None and c.value >= 1 else profile.m_sat * tp
