"""Cost model: a batch plan's predicted duration from a hardware profile and a model shape.

Pure functions (no SimPy, no state visible to callers). Every coefficient comes from the
profile (``granisim/hardware.py``); per (profile, model) the derived constants are built once
into a cached :class:`CostTables`.

Operator families and their forms (per layer unless noted; ``P`` = ``bf16_flops``,
``BW`` = ``hbm_bandwidth``, ``b`` = dtype bytes, ``kvb = 2 * n_kv * d * b`` bytes of K+V per
token per layer; every family is least-squares fittable from microbenchmarks):

``linear``
    QKV projection, O projection, MLP up (gated: 2 x intermediate), activation, MLP down, two
    RMS norms, RoPE, two residual adds per layer over the step's ``T`` new tokens; once per step
    the embedding and the final norm. Roofline per family:
    ``t(n) = launch_s + max(F(n) / (P * flop_eff), B(n) / (BW * mem_eff))`` (element-wise
    families: ``F = 0``). With a profile ``linear_table`` (a100-80gb: Vidur's A100 timings of
    Llama-3-8B) the table is used instead, interpolated linearly in ``n`` (proportional beyond
    its last row), carried to other model shapes per operator by the ratio of roofline times
    ``max(F_model/P, B_model/BW) / max(F_table/P, B_table/BW)`` — the FLOPs ratio where the
    operator is compute-bound, the bytes ratio where it is memory-bound — and made
    non-decreasing: a size costs no more than the cheapest larger measured size (pad up to it).
``lm_head``
    ``rows x hidden x vocab`` GEMM (roofline, family ``lm_head``), ``rows`` = one per request.
``attn_prefill``
    prefill / extend, causal over context + chunk, one kernel: rows ``num_new * G`` per KV head
    padded to the launch's tile (form 2: ``attn.prefill.m_tile`` once its longest chunk stacks that many
    rows, else 64, as the extend kernel picks; form 1: ``attn.prefill.m_tile``);
    ``F = 4 d n_q (q c + q (q+1) / 2) * pad``,
    ``B = c kvb / storage_eff + q kvb + Q/O``; ``t = launch + max(F/(P e_f), B/(BW e_m))``.
    Prefill requests take no part in prefix passes (their shared part is read here, at the
    group's storage efficiency).
``attn_decode``
    one kernel over every decode request's KV that is not read by a prefix pass: the whole
    context for path ``paged`` and ungrouped requests (the shared prefix re-read by every
    member: the baseline's cost), ``context - shared_len`` for members of ``cascade``/``dense``
    groups. Rows ``G`` padded to ``attn.decode.m_tile``; bytes divided by the storage gather
    efficiency (shared part: the group's storage; the rest: the plan's page size).
``attn_prefix``
    one pass per ``cascade``/``dense`` group over its ``L`` prefix tokens, ``M = m_eff`` rows
    per KV head padded to the kernel's M tile (``tiles = ceil(M / m_tile)``);
    ``F = 4 * tiles * m_tile * n_kv * d * L``; the prefix bytes are read once per M tile.
    ``dense``: large tile, no KV split: ``n_kv * tiles`` CTAs, occupancy
    ``min(1, CTAs / sm_count)`` divides the roofline time (few CTAs -> idle SMs).
    ``cascade``: small tile, KV split into ``min(ceil(ctas_per_sm * SMs / CTAs), ceil(L /
    min_split_tokens))`` chunks (full occupancy), fp32 partials written and combined.
``merge``
    LSE merge of prefix and suffix partials: per member ``n_q * (2 (d+1) 4 + d b)`` bytes.
``kv_write``
    new tokens' K/V: ``2 * T * kvb`` bytes (read + write) at ``kv.write_eff``.
``kv_copy``
    compaction copies of ``plan.copies``, all layers, read + write, at ``kv.copy_eff``.
``overhead``
    ``overhead.step_s`` per step (host work). Each attention / KV kernel adds
    ``overhead.kernel_launch_s`` per layer (linear-operator times include their own).

``plan.num_steps = n > 1`` (decode fast-forward): step ``s`` sees every context grown by
``s``; only ``attn_decode`` changes with ``s`` and is evaluated for all ``s`` at once with
numpy. Copies are applied in the first step.
"""

from __future__ import annotations

import numpy as np

from granisim.config.hardware import HardwareProfile
from granisim.config.models import ModelShape
from granisim.core.contract import BatchPlan, StepResult

from .host_build import repeats, with_rebuild
from .correction import Correction, storage_class
from .step_classes import corrected
from .operators import (BREAKDOWN_KEYS, ELEMENTWISE_FAMILIES, ENGINE_KEYS, GEMM_FAMILIES, LAYER_OPS, STEP_OPS,
                        fit_roofline, op_work, roofline_time)
from .tables import CostTables

__all__ = ["BREAKDOWN_KEYS", "ELEMENTWISE_FAMILIES", "ENGINE_KEYS", "GEMM_FAMILIES", "LAYER_OPS", "STEP_OPS", "Correction",
           "CostTables", "cheaper_path", "cost_tables", "fit_roofline", "group_path_cost", "m_sat_crossover",
           "finished", "m_sat_threshold", "op_work", "plan_cost", "roofline_time", "step_cost", "storage_class"]

_TABLES: dict[tuple, CostTables] = {}


def cost_tables(profile: HardwareProfile, model: ModelShape) -> CostTables:
    """The cached constants of (profile, model) (built once per profile object and model)."""
    key = (profile, model)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = CostTables(profile, model)
    return t


# ---- public functions --------------------------------------------------------------------------
def step_cost(plan: BatchPlan, profile: HardwareProfile, model: ModelShape, after: BatchPlan | None = None) -> StepResult:
    """Predicted duration and breakdown (keys :data:`BREAKDOWN_KEYS`, and ``host_copy`` when the plan moves KV
    to or from a host tier) of ``plan`` (all its steps), as the simulator's executor prices it when ``after`` was
    the plan before it (None: the first)."""
    return plan_cost(cost_tables(profile, model), plan, profile, after)


def plan_cost(tables: CostTables, plan: BatchPlan, profile: HardwareProfile,
              after: BatchPlan | None = None) -> StepResult:
    """``plan`` priced by ``tables`` (:func:`finished`), after ``after``."""
    result = tables.step(plan)
    if tables.rebuild and not repeats(after, plan):
        result = with_rebuild(result, tables.rebuild)
    return finished(tables, plan, result, profile)


def finished(tables: CostTables, plan: BatchPlan, result: StepResult, profile: HardwareProfile) -> StepResult:
    """``plan``'s compute ``result`` times its class's measured factor where the profile has one, lengthened by
    the host-tier copies compute does not hide."""
    if tables.step_classes:
        result = corrected(tables.step_classes, plan, result)
    if not plan.transfers:
        return result
    from granisim.costmodel.transfers import with_transfers

    return with_transfers(plan, result, profile)


def group_path_cost(profile: HardwareProfile, model: ModelShape, path: str, prefix_len: int, b_group: int,
                    storage: str = "slab", page_size: int = 1) -> float:
    """Seconds (one step, all layers) of one group's prefix pass by ``path`` ('dense' | 'cascade')
    for ``b_group`` decode requests over ``prefix_len`` shared tokens. The suffix pass and the
    merge are the same for both paths and are not included."""
    t = cost_tables(profile, model)
    return t.prefix_time(path, int(prefix_len), int(b_group) * t.G, storage, page_size)


def cheaper_path(profile: HardwareProfile, model: ModelShape, prefix_len: int, b_group: int,
                 storage: str = "slab", page_size: int = 1) -> str:
    """'dense' or 'cascade', whichever the model predicts cheaper (ties: dense); 'cascade'
    when the prefix is not one contiguous slab (dense needs a slab)."""
    if storage != "slab":
        return "cascade"
    d = group_path_cost(profile, model, "dense", prefix_len, b_group, storage, page_size)
    c = group_path_cost(profile, model, "cascade", prefix_len, b_group, storage, page_size)
    return "dense" if d <= c else "cascade"


def m_sat_crossover(profile: HardwareProfile, model: ModelShape, prefix_len: int, max_m_eff: int = 16384) -> int | None:
    """Smallest ``M_eff = B * G`` (B = 1 .. max_m_eff / G) from which the dense prefix pass is no
    dearer than cascade for every larger B in the range; None if dense never wins."""
    t = cost_tables(profile, model)
    m = np.arange(1, max_m_eff // t.G + 1) * t.G
    dense = t.prefix_time_array("dense", prefix_len, m)
    casc = t.prefix_time_array("cascade", prefix_len, m)
    lose = np.nonzero(dense > casc)[0]
    if lose.size == 0:
        return int(m[0])
    i = int(lose[-1]) + 1
    return int(m[i]) if i < m.size else None


def m_sat_threshold(profile: HardwareProfile, model: ModelShape, prefix_len: int, max_m_eff: int = 16384) -> int:
    """The one threshold ``T`` (dense iff ``M_eff >= T``) that minimises the summed relative excess time
    over the cheaper path for ``M_eff = B * G``, B = 1 .. max_m_eff / G (log-spaced), at this prefix
    length: the model's counterpart of the measured M_sat (granisim.calibration.msat). Unlike
    :func:`m_sat_crossover` a single M_eff where dense loses (an unlucky wave count) does not move it."""
    t = cost_tables(profile, model)
    b = np.unique(np.round(np.geomspace(1, max_m_eff // t.G, 160)))
    m = b * t.G
    dense = t.prefix_time_array("dense", prefix_len, m)
    casc = t.prefix_time_array("cascade", prefix_len, m)
    best = np.minimum(dense, casc)
    excess = [float(np.sum(np.where(m >= T, dense, casc) / best - 1.0)) for T in m]
    return int(m[int(np.argmin(excess))])
