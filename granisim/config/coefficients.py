"""The coefficient catalogue and the data classes of a hardware profile.

Every number the cost model uses is a named coefficient with a unit, a validity rule and a
source (measured, published or extrapolated). :data:`COEFFICIENTS` must be present in every
profile; :data:`OPTIONAL_COEFFICIENTS` carry defaults. Reading and validating profile files is
granisim.config.hardware's job; this module holds what a profile *is*, so that the cost model, the
calibration and the loader share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

# name -> (unit, rule). Rules: pos = finite > 0; frac = 0 < x <= 1; int = integer >= 1; nonneg = >= 0.

# Streams served mostly from L2: rates relative to hbm_bandwidth that may exceed 1 (rule pos), fitted past HBM
# (granisim.calibration.fit) and derived with the SMs, not HBM (granisim.calibration.profile.derive). The prefill
# pass: a launch's query tiles re-read each head's K/V tiles.
L2_STREAMS = ("attn.prefill.mem_eff",)
COEFFICIENTS: dict[str, tuple[str, str]] = {
    # the GPU
    "memory_bytes": ("B", "pos"),
    "hbm_bandwidth": ("B/s", "pos"),
    "bf16_flops": ("FLOP/s", "pos"),
    "sm_count": ("SMs", "int"),
    "m_sat": ("rows", "int"),
    # fixed costs
    "overhead.step_s": ("s", "nonneg"),
    "overhead.kernel_launch_s": ("s", "nonneg"),
    # linear operators: t = launch_s + max(FLOPs / (bf16_flops * flop_eff), bytes / (hbm_bandwidth * mem_eff))
    **{f"linear.{fam}.{k}": (u, r)
       for fam in ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "lm_head")
       for k, u, r in (("launch_s", "s", "nonneg"), ("flop_eff", "", "frac"), ("mem_eff", "", "frac"))},
    # element-wise operators: t = launch_s + bytes / (hbm_bandwidth * mem_eff)
    **{f"linear.{fam}.{k}": (u, r)
       for fam in ("mlp_act", "norm", "rope", "add", "embedding")
       for k, u, r in (("launch_s", "s", "nonneg"), ("mem_eff", "", "frac"))},
    # attention
    "attn.prefill.m_tile": ("rows", "int"),
    "attn.prefill.flop_eff": ("", "frac"),
    "attn.prefill.mem_eff": ("", "pos"),
    "attn.decode.m_tile": ("rows", "int"),
    "attn.decode.flop_eff": ("", "frac"),
    "attn.decode.mem_eff": ("", "frac"),
    "attn.cascade.m_tile": ("rows", "int"),
    "attn.cascade.flop_eff": ("", "frac"),
    "attn.cascade.mem_eff": ("", "frac"),
    "attn.cascade.ctas_per_sm": ("CTAs", "int"),
    "attn.cascade.min_split_tokens": ("tokens", "int"),
    "attn.cascade.launches": ("kernels", "int"),
    "attn.dense.m_tile": ("rows", "int"),
    "attn.dense.flop_eff": ("", "frac"),
    "attn.dense.mem_eff": ("", "frac"),
    "attn.dense.launches": ("kernels", "int"),
    "attn.merge.mem_eff": ("", "frac"),
    # KV movement
    "kv.write_eff": ("", "frac"),
    "kv.copy_eff": ("", "frac"),
    # storage: fraction of the contiguous read rate reached when gathering KV
    "storage.slab_eff": ("", "frac"),
    "storage.page1_eff": ("", "frac"),
    "storage.page16_eff": ("", "frac"),
}


# a kernel family's launch terms (explained below): name, unit, rule, default
_LAUNCH_TERMS = (("launch_s", "s", "nonneg", 0.0), ("program_s", "s", "nonneg", 0.0),
                 ("sat_ctas_per_sm", "CTAs", "pos", 1.0), ("resident_ctas_per_sm", "CTAs", "int", 1))

# Optional coefficients: absent means the default (which keeps the first cost-model forms). ``attn.form = 2``
# selects the attention/KV forms fitted to the Triton kernels (granisim/costmodel/) and then needs all of
# FORM2_COEFFICIENTS; name -> (unit, rule, default).
FORM2_DEFAULTS: dict[str, tuple[str, str, float]] = {
    # Form 2 kernel model, per kernel family (attn.prefill/decode/cascade/dense/merge, kv.write_):
    #   launch_s              fixed time per launch (launch, in-graph gap, prologue, epilogue)
    #   program_s             fixed time per program (its first loads' latency, its stores)
    #   sat_ctas_per_sm       programs per SM needed to reach mem_eff (one program streams at most
    #                         hbm_bandwidth * mem_eff / (sm_count * sat_ctas_per_sm))
    #   resident_ctas_per_sm  programs an SM runs at once (programs beyond run in later waves)
    **{f"attn.{p}.{k}": (u, r, d)
       for p in ("prefill", "decode", "cascade", "dense", "merge") for k, u, r, d in _LAUNCH_TERMS},
    **{f"kv.write_{k}": (u, r, d) for k, u, r, d in _LAUNCH_TERMS},
    "kv.copy_launch_s": ("s", "nonneg", 0.0),
    # the extend kernel's own gather efficiencies (no split along KV: few programs, latency-bound gathers)
    "attn.prefill.page1_eff": ("", "frac", 1.0),
    "attn.prefill.page16_eff": ("", "frac", 1.0),
    "attn.cascade.min_m_tile": ("rows", "int", 16),
    # split-KV over gathered storage (page tables, slot lists) with row tiles <= 64: programs per SM, rounded up
    "attn.cascade.gather_ctas_per_sm": ("CTAs", "int", 1),
    "attn.cascade.max_splits": ("splits", "int", 64),
    "attn.dense.max_splits": ("splits", "int", 1),
}
# step sizes (tokens) at which the engine's per-step linear offset is fitted: 1, 2, 4 ... 2048, log-linear in
# between and flat beyond. The real engine's CUDA-graph limit is a profile coefficient (engine.graph_max_tokens),
# read from the run the profile was fitted on: steps of more tokens ran eagerly and are priced with engine.eager.*
LINEAR_KNOTS = tuple(1 << i for i in range(12))
ENGINE_DEFAULTS: dict[str, tuple[str, str, float]] = {
    # the real engine's in-situ time per breakdown key vs the microbenchmark-fitted model:
    # key time = scale * model time + offset per launch of the key (CUDA-graph gaps, in-graph timing marks;
    # attn_decode launches 1-2 kernels a step, attn_prefix one per prefix pass, the others one), fitted on
    # real-engine runs (granisim.calibration.engine_fit); per request host work of a step's metadata
    # (engine.eager.*: the same for steps of more than graph_max_tokens, which the engine runs eagerly
    # with a launch per operator instead of replaying a CUDA graph; 0 = one set for all steps)
    **{f"engine.{m}{k}.{c}": (u, r, d)
       for m in ("", "eager.")
       for k in ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write")
       for c, u, r, d in (("scale", "", "pos", 1.0), ("offset_s", "s", "nonneg", 0.0))},
    "engine.graph_max_tokens": ("tokens", "nonneg", 0),
    # layers of the model the engine offsets were fitted on: a per-layer kernel's offset (a gap per launch, one
    # launch per layer) scales to another model by its layers / these; 0 = the offsets as fitted, for any model
    "engine.fit_layers": ("layers", "nonneg", 0),
    # graph-replayed steps' linear offset by step size (knots in tokens, log-linear between them; where a
    # profile has them they replace engine.linear.offset_s): with one flat offset the engine's 1-token steps
    # measured 2% under it, its 2-32-token steps 1-2% over (reports/validation/)
    **{f"engine.linear.offset_t{n}_s": ("s", "nonneg", 0.0) for n in LINEAR_KNOTS},
    # decode over a shared prefix that every member of a group re-reads in the same launch (the baselines):
    # the members after the first cost this fraction of a first read (their reads hit L2); 1 = no reuse
    "attn.decode.shared_reread": ("", "frac", 1.0),
    # the same share for the decode kernel alone (calibration.measure shared_decode; granisim/calibration/reread.py):
    # not priced; `granisim profile carry` reads it on both GPUs (granisim/calibration/carry.py)
    "attn.decode.kernel_reread": ("", "frac", 1.0),
    # an eager step launches every operator from the host: its linear part takes at least this long
    "engine.eager.linear_floor_s": ("s", "nonneg", 0.0),
    # an eager step that prefills n requests runs their prefill attention slower than the same launch alone
    # (reports/validation/, "Eager prefill steps"): the kernel's time times 1 + multi_gain * (n - 1) / n, and
    # times 1 + multi_cached * multi_gain * (n - 1) / n where every one of them prefills over cached context
    # (a prefix hit or an earlier chunk); multi_gain 0 = no such effect
    "engine.eager.attn_prefill.multi_gain": ("", "nonneg", 0.0),
    "engine.eager.attn_prefill.multi_cached": ("", "share", 1.0),
    # a step's prefill and prefix attention between its GEMMs against its price (reports/validation/current_engine/
    # attn_in_step.md; fitted by granisim.validation.refit): in a step with prefill work over T new tokens, the prefill
    # attention's share over the requests' own tokens (its FLOPs' share) takes self_scale times its price, the share
    # over cached context and the prefix passes context_scale + context_per_ktok * T / 1000 times (measured alone by
    # gpu_backend/bench/attention_after_gemm.py: not L2's state; the cause is open); 1, 1, 0 = priced as alone
    "engine.attn_in_step.self_scale": ("", "pos", 1.0),
    "engine.attn_in_step.context_scale": ("", "pos", 1.0),
    "engine.attn_in_step.context_per_ktok": ("", "nonneg", 0.0),
    "overhead.per_request_s": ("s", "nonneg", 0.0),
    "overhead.per_kv_token_s": ("s", "nonneg", 0.0),  # host slot lists: per private KV token a step reads
    "overhead.per_pass_s": ("s", "nonneg", 0.0),  # host metadata of each prefix pass (group maps, storage)
    # a step the engine builds in full, not derived from the one before (granisim.costmodel.host_build)
    "overhead.rebuild_s": ("s", "nonneg", 0.0),
}
# what the microbenchmark calibration fits (calibration/fit.py); the engine ones come from engine runs
KERNEL_MODEL_COEFFICIENTS = {
    "attn.form": ("", "int", 1), **FORM2_DEFAULTS,
    # split-KV load balance: in a batch whose longest sequence exceeds balance_skew x its mean length,
    # no split longer than max(balance_chunk, the mean); balance_chunk 0 = none (kernels before it;
    # optional so that profiles fitted to them stay valid)
    "attn.cascade.balance_chunk": ("tokens", "int", 0),
    "attn.cascade.balance_skew": ("", "pos", 2.0),
    # such a batch's programs (split chunks of very mixed lengths) stream the KV they share the GPU's bandwidth
    # for this many times slower than equal programs do (granisim/calibration/skew.py); 1 = as fast
    "attn.decode.skew_stream": ("", "pos", 1.0)}
# Tensor parallelism and mixture of experts (granisim/costmodel/parallel.py). A profile without them prices
# tp = 1 and dense models as before; a tp > 1 scenario needs its tp's all-reduce pair.
TP_DEGREES = (2, 4, 8)
PARALLEL_COEFFICIENTS: dict[str, tuple[str, str, float]] = {
    # one all-reduce of S bytes per GPU over tp GPUs (ring / NVLS):
    #   t = latency_s + S * 2 (tp - 1) / tp / busbw        (busbw: nccl-tests' "bus bandwidth")
    **{f"comm.allreduce.tp{n}.{k}": (u, r, 0.0)
       for n in TP_DEGREES for k, u, r in (("latency_s", "s", "nonneg"), ("busbw", "B/s", "pos"))},
    # the MoE grouped GEMMs (all active experts' up+gate, then down, one launch each), roofline per family as
    # the dense linear families; absent: the dense mlp_up / mlp_down coefficients (default 0 = absent)
    **{f"linear.moe_{fam}.{k}": (u, r, 0.0)
       for fam in ("up", "down")
       for k, u, r in (("launch_s", "s", "nonneg"), ("flop_eff", "", "frac"), ("mem_eff", "", "frac"))},
    # rows of an expert's tile in the grouped GEMM: an active expert's rows are padded up to a multiple
    "moe.m_tile": ("rows", "int", 16),
    # M_sat of a tp replica's GPUs (each holds n_kv / tp KV heads: the dense pass has fewer CTAs); absent (0):
    # m_sat x tp (granisim.config.replica.replica_m_sat)
    **{f"m_sat.tp{n}": ("rows", "nonneg", 0.0) for n in TP_DEGREES},
}
# The host link of a host-memory KV tier (granisim/kv/host_tier.py, [hardware] host_kv_gb > 0); priced by
# granisim/costmodel/transfers.py. A contiguous copy (a HOT slab) takes copy_launch_s + bytes / link_bandwidth;
# a page-granular one (COLD / token / paged pages, gathered as HiCache does) pieces * page_copy_s + bytes /
# page_bandwidth_<direction> (0: link_bandwidth). The two directions' copies overlap by `duplex`, and up to `overlap`
# of the step's compute hides the copy stream. Defaults:
# PCIe Gen5 x16 (the h200 profile's extrapolated figures) until a GPU run measures them.
HOST_COEFFICIENTS: dict[str, tuple[str, str, float]] = {
    "host.link_bandwidth": ("B/s", "pos", 55e9),
    "host.copy_launch_s": ("s", "nonneg", 10e-6),
    "host.page_copy_s": ("s", "nonneg", 1e-6),
    "host.page_bandwidth_to_gpu": ("B/s", "nonneg", 0.0),
    "host.page_bandwidth_to_host": ("B/s", "nonneg", 0.0),
    "host.overlap": ("", "share", 0.8),  # 0: no copy hidden (an engine that serializes them)
    # 1: copies to the GPU and to the host run at once (a full-duplex link, two copy streams); 0: one after another
    "host.duplex": ("", "share", 1.0),
}
OPTIONAL_COEFFICIENTS = {**KERNEL_MODEL_COEFFICIENTS, **ENGINE_DEFAULTS, **PARALLEL_COEFFICIENTS,
                         **HOST_COEFFICIENTS}
FORM2_COEFFICIENTS = tuple(FORM2_DEFAULTS)


class ProfileError(ValueError):
    """A profile file is missing, unreadable or invalid (one line: file, field, value)."""


# ---- data ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Source:
    kind: str  # 'measured' | 'published' | 'extrapolated'
    citation: str | None = None  # published
    date: str | None = None  # measured
    command: str | None = None  # measured
    from_: str | None = None  # extrapolated: from what
    how: str | None = None  # extrapolated: how
    note: str | None = None
    extra: Mapping[str, str] | None = None  # measured: gpu, commit, versions

    def describe(self) -> str:
        if self.kind == "published":
            s = f"published: {self.citation}"
        elif self.kind == "measured":
            s = f"measured {self.date}: {self.command}"
        else:
            s = f"extrapolated from {self.from_}: {self.how}"
        return s + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True, slots=True)
class Coefficient:
    value: float
    unit: str
    source: Source


@dataclass(frozen=True, slots=True)
class LinearTable:
    """Measured per-operator times (ms, medians) at one model shape, by num_tokens."""

    path: Path
    model: Mapping[str, int]  # hidden, n_q_heads, n_kv_heads, head_dim, intermediate, vocab, dtype_bytes
    scaling: str
    source: Source
    num_tokens: tuple[int, ...]
    ops_ms: Mapping[str, tuple[float, ...]]  # column (e.g. 'mlp_up_proj') -> ms per num_tokens
    # per-shard timings of tensor-parallel runs where the table has them: tp -> (num_tokens, ops_ms)
    tp_ops: Mapping[int, tuple] = field(default_factory=lambda: MappingProxyType({}))


KERNEL_TABLE_COLS = ("family", "storage", "G", "B", "L", "M_eff", "q_len", "n_req", "T", "n_splits", "median_us")
KERNEL_TABLE_OPTIONAL = ("n_splits",)  # the split count a row's launch ran; absent or 0: not recorded
KERNEL_FAMILIES = ("decode", "cascade", "dense", "extend", "merge", "kv_write")


@dataclass(frozen=True, slots=True)
class KernelTable:
    """Measured per-layer kernel times (calibration.measure attention.csv rows) at one model shape.
    With ``attn.form = 2`` the cost model multiplies its formula by the measured / formula ratio,
    interpolated over these points (granisim/costmodel/correction.py ``Correction``)."""

    path: Path | None
    model: Mapping[str, int]
    source: Source
    rows: Mapping[str, tuple]  # column (KERNEL_TABLE_COLS) -> values


@dataclass(frozen=True, slots=True)
class StepClasses:
    """Engine time over the cost model's price per model, policy and class of step
    (granisim/costmodel/step_classes.py): ``factors[model][policy][class]``."""

    factors: Mapping[str, Mapping[str, Mapping[str, float]]]
    source: Source

    def for_model(self, model: str, tp: int = 1) -> Mapping[str, Mapping[str, float]] | None:
        """The model's factors by policy; None if it is not listed or is a tensor-parallel shard (fitted on one GPU)."""
        return self.factors.get(model) if tp == 1 else None


@dataclass(frozen=True, slots=True, eq=False)  # identity hash: usable as a cache key
class HardwareProfile:
    name: str
    gpu: str
    coefficients: Mapping[str, Coefficient]
    linear_table: LinearTable | None = None
    notes: str = ""
    path: Path | None = None
    kernel_table: KernelTable | None = None
    # linear tables measured at other model shapes: a model is priced from the nearest (costmodel.tables)
    more_linear_tables: tuple[LinearTable, ...] = ()
    step_classes: StepClasses | None = None  # measured corrections by class of step (optional)
    base: str | None = None  # the profile this one was made from (config/profile_base.py), as its file names it

    def __getitem__(self, name: str) -> float:
        c = self.coefficients.get(name)
        if c is None and name in OPTIONAL_COEFFICIENTS:
            return OPTIONAL_COEFFICIENTS[name][2]
        return self.coefficients[name].value

    @property
    def memory_bytes(self) -> float:
        return self["memory_bytes"]

    @property
    def hbm_bandwidth(self) -> float:
        return self["hbm_bandwidth"]

    @property
    def bf16_flops(self) -> float:
        return self["bf16_flops"]

    @property
    def sm_count(self) -> int:
        return int(self["sm_count"])

    @property
    def m_sat(self) -> int:
        return int(self["m_sat"])

    def describe(self) -> str:
        """The coefficients with their units and sources, one per line."""
        lines = [f"{self.name} ({self.gpu})" + (f" — {self.path}" if self.path else "")
                 + (f", made from {self.base}" if self.base else "")]
        w = max(map(len, self.coefficients))
        for k, c in self.coefficients.items():
            lines.append(f"  {k:<{w}}  {c.value:>12.6g} {c.unit:<7} {c.source.describe()}")
        if self.linear_table is not None:
            lt = self.linear_table
            lines.append(f"  linear_table: {lt.path.name} ({len(lt.num_tokens)} token counts) — "
                         f"{lt.source.describe()}; {lt.scaling}")
        for lt in self.more_linear_tables:
            rows = [f"{len(lt.num_tokens)} token counts"] if lt.num_tokens else []
            rows += [f"tp {', '.join(map(str, sorted(lt.tp_ops)))} shard rows"] if lt.tp_ops else []
            lines.append(f"  more_linear_tables: {lt.path.name} ({'; '.join(rows)}) — {lt.source.describe()}")
        if self.step_classes is not None:
            sc = self.step_classes
            n = sum(len(c) for by_policy in sc.factors.values() for c in by_policy.values())
            lines.append(f"  step_classes: {n} factors for {', '.join(sorted(sc.factors))} — {sc.source.describe()}")
        if self.kernel_table is not None:
            kt = self.kernel_table
            lines.append(f"  kernel_table: {kt.path.name if kt.path else '(in memory)'} ({len(kt.rows['family'])} "
                         f"kernel timings; form-2 formulas x measured/formula, interpolated) — {kt.source.describe()}")
        return "\n".join(lines)
