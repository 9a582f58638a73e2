"""Tensor-parallel all-reduces and mixture-of-experts layers (pure functions + a CostTables mixin).

**Tensor parallelism.** A replica of ``tp`` GPUs runs one shard of the model per GPU
(:meth:`granisim.config.models.ModelShape.shard`); the cost model prices one GPU's shard (every GPU
does the same work at the same time) plus the collectives that join them, as vLLM/Megatron run them:

* two all-reduces per layer, of the step's ``T x hidden`` activations (after the row-parallel O
  projection and after the row-parallel MLP down projection — or the experts' down projection);
* one all-reduce of the vocabulary-parallel embedding's output per step;
* one all-gather of the vocabulary-parallel LM head's logits (``rows x vocab``), priced as an
  all-reduce of half their bytes (a ring all-gather moves ``(n-1)/n`` of its output per GPU, an
  all-reduce ``2 (n-1)/n`` of its input).

One all-reduce of ``S`` bytes per GPU: ``t = latency_s + S * 2 (tp - 1) / tp / busbw`` with the
profile's ``comm.allreduce.tp{tp}.latency_s`` and ``.busbw`` (nccl-tests' bus bandwidth, whose
definition is exactly this ``2 (n-1)/n`` factor). The all-reduce time is part of the breakdown's
``linear`` key (the row-parallel linear layers issue them) and the LM head's gather of ``lm_head``.

**Mixture of experts.** Per MoE layer over ``T`` tokens (one GPU's shard: each expert's columns split
over ``tp``, the router replicated):

* router GEMM ``T x hidden x E`` (roofline of the grouped up family), softmax + top-k over
  ``T x E`` logits (element-wise, ``mlp_act`` family), token permutation and the weighted un-permute
  (``add`` family: ``T k hidden`` rows read and written twice);
* grouped GEMMs, one launch each for up+gate (``hidden -> 2 I``) and down (``I -> hidden``): FLOPs of
  ``T k`` rows, each active expert's rows padded up to ``moe.m_tile``; bytes = the **active** experts'
  weights, read once per step, plus the rows in and out; the SwiGLU between them element-wise;
* a shared expert, where the model has one, is a dense MLP (the ``intermediate`` of the shape).

Expected active experts of a layer for ``T`` tokens with top-``k`` of ``E``: expert ``i`` is picked by
one token with probability ``q_i`` and is active with ``1 - (1 - q_i)^T``. ``uniform`` routing:
``q_i = k / E`` (so ``E (1 - (1 - k/E)^T)`` active). ``zipf``: ``q_i = min(1, k p_i)`` with
``p_i ~ i^-s`` (``s`` = ``model.expert_zipf_s``), a skewed router whose popular experts are always
active. The grouped-GEMM coefficients ``linear.moe_up.*`` / ``linear.moe_down.*`` come from a
grouped-GEMM calibration table where one was measured; without them the dense MLP coefficients price
the grouped GEMM (the dense roofline, an extrapolation the profile's source says).
"""

from __future__ import annotations

import numpy as np

from granisim.config.hardware import HardwareProfile
from granisim.config.models import ModelShape

from .operators import roofline_time


# ---- pure functions ----------------------------------------------------------------------------
def allreduce_time(latency_s: float, busbw: float, tp: int, nbytes):
    """The all-reduce curve: ``latency_s + nbytes x 2 (tp - 1) / tp / busbw`` (nccl-tests' bus bandwidth)."""
    return latency_s + np.asarray(nbytes, float) * 2.0 * (tp - 1) / tp / busbw


def allreduce_seconds(profile: HardwareProfile, tp: int, nbytes):
    """Seconds of one all-reduce of ``nbytes`` per GPU over ``tp`` GPUs (0 for tp = 1)."""
    if tp <= 1:
        return 0.0 * np.asarray(nbytes, float)
    bw = profile.coefficients.get(f"comm.allreduce.tp{tp}.busbw")
    if bw is None:
        raise ValueError(f"profile {profile.name} has no coefficients.comm.allreduce.tp{tp}.busbw "
                         f"(needed for tp = {tp})")
    return allreduce_time(profile[f"comm.allreduce.tp{tp}.latency_s"], bw.value, tp, nbytes)


def allreduces_per_step(model: ModelShape) -> int:
    """All-reduces of a step's activations: two per layer and the embedding's (0 for tp = 1)."""
    return 0 if model.tp <= 1 else 2 * model.num_layers + 1


def expert_pick_probs(model: ModelShape) -> np.ndarray:
    """Per expert: the probability one token routes to it (sums to ``experts_per_token``)."""
    E, k = model.num_experts, model.experts_per_token
    if model.expert_routing == "uniform":
        return np.full(E, k / E)
    if model.expert_routing != "zipf":
        raise ValueError(f"unknown expert routing {model.expert_routing!r}")
    p = np.arange(1, E + 1, dtype=float) ** -model.expert_zipf_s
    q = k * p / p.sum()
    for _ in range(64):  # cap at 1 and hand the excess to the others (a token picks k distinct experts)
        over = q > 1.0
        if not over.any():
            break
        excess = float((q[over] - 1.0).sum())
        q[over] = 1.0
        free = ~over & (q < 1.0)
        share = q[free].sum()
        if share > 0:
            q[free] += excess * q[free] / share
        else:  # the rest's popularity underflowed to 0 (a large s): the next most popular take whole picks
            idx = np.flatnonzero(free)[: int(np.ceil(excess - 1e-9))]
            q[idx] = np.minimum(1.0, excess - np.arange(len(idx)))
    return np.minimum(q, 1.0)


def expected_expert_rows(model: ModelShape, tokens, m_tile: int):
    """(expected active experts, expected padded rows of the grouped GEMM) for ``tokens`` (array ok)."""
    q = expert_pick_probs(model)
    t = np.atleast_1d(np.asarray(tokens, float))[:, None]
    active_p = 1.0 - (1.0 - q[None, :]) ** t  # [n, E]
    rows = t * q[None, :]
    cond = np.where(active_p > 0, rows / np.maximum(active_p, 1e-300), 0.0)  # rows given active
    padded = active_p * np.ceil(np.maximum(cond, 1.0) / m_tile) * m_tile
    active, pad = active_p.sum(axis=1), padded.sum(axis=1)
    if np.ndim(tokens) == 0:
        return float(active[0]), float(pad[0])
    return active, pad


def moe_layer_work(model: ModelShape, tokens, m_tile: int) -> dict[str, tuple]:
    """(FLOPs, bytes) per part of one MoE layer of one GPU's shard over ``tokens`` new tokens."""
    h, E, k, I, b = (model.hidden, model.num_experts, model.experts_per_token, model.expert_intermediate,
                     float(model.dtype_bytes))
    n = np.asarray(tokens, float)
    active, padded = expected_expert_rows(model, n, m_tile)
    rows = n * k
    return {
        "router": (2.0 * n * h * E, b * (h * E + n * (h + E))),
        "gate": (0.0 * n, 4.0 * n * E * 2 + 8.0 * n * k),  # fp32 logits in/out, top-k ids and weights
        "permute": (0.0 * n, 2.0 * 2.0 * b * rows * h),  # dispatch and weighted combine: read + write
        "up": (2.0 * padded * h * 2 * I, b * (active * h * 2 * I + rows * (h + 2 * I))),
        "act": (0.0 * n, b * rows * 3 * I),
        "down": (2.0 * padded * I * h, b * (active * I * h + rows * (I + h))),
    }


# ---- the CostTables part -----------------------------------------------------------------------
class ParallelPricing:
    """CostTables' all-reduce and MoE terms (``self.profile``, ``self.model``, ``self.fam`` set)."""

    def _init_parallel(self) -> None:
        p, m = self.profile, self.model
        self.tp = m.tp
        self.has_parallel = m.tp > 1 or m.is_moe
        if m.tp > 1:
            allreduce_seconds(p, m.tp, 1.0)  # a profile without this tp's curve fails here, not mid-run
        self.moe_fam = {}
        if m.is_moe:
            self.moe_tile = int(p["moe.m_tile"])
            for fam, dense in (("up", "mlp_up"), ("down", "mlp_down")):
                if f"linear.moe_{fam}.flop_eff" in p.coefficients:
                    self.moe_fam[fam] = tuple(p[f"linear.moe_{fam}.{k}"] for k in ("launch_s", "flop_eff", "mem_eff"))
                else:  # not measured: the dense GEMM roofline
                    self.moe_fam[fam] = self.fam[dense]

    def allreduce_time(self, tokens):
        """All-reduces of one step over ``tokens`` new tokens (all layers and the embedding)."""
        return allreduces_per_step(self.model) * allreduce_seconds(self.profile, self.tp,
                                                                   tokens * self.model.hidden * self.model.dtype_bytes)

    def moe_time(self, tokens):
        """The MoE layers of one step (all layers) over ``tokens`` new tokens (one GPU's shard)."""
        w = moe_layer_work(self.model, tokens, self.moe_tile)
        fam = {"router": self.moe_fam["up"], "gate": self.fam["mlp_act"], "permute": self.fam["add"],
               "up": self.moe_fam["up"], "act": self.fam["mlp_act"], "down": self.moe_fam["down"]}
        t = 0.0
        for part, (f, by) in w.items():
            launch, ef, em = fam[part]
            t = t + roofline_time(f, by, self.P, self.BW, launch, ef, em)
        return self.layers * t

    def parallel_time(self, tokens: int) -> float:
        """What tensor parallelism and MoE add to a step's linear part (0 for tp = 1 dense models)."""
        if tokens <= 0 or not self.has_parallel:
            return 0.0
        t = 0.0
        if self.model.is_moe:
            t += float(self.moe_time(tokens))
        if self.tp > 1:
            t += float(self.allreduce_time(tokens))
        return t

    def logits_gather_time(self, rows: int) -> float:
        """The vocabulary-parallel LM head's all-gather of ``rows`` logits rows (0 for tp = 1)."""
        if self.tp <= 1 or rows <= 0:
            return 0.0
        return float(allreduce_seconds(self.profile, self.tp, rows * self.model.vocab * self.model.dtype_bytes / 2.0))


def skips_dense_mlp(model: ModelShape, family: str) -> bool:
    """A MoE model without a dense (shared) MLP has no mlp_up / mlp_act / mlp_down operators."""
    return model.intermediate == 0 and family in ("mlp_up", "mlp_act", "mlp_down")


__all__ = ["ParallelPricing", "allreduce_seconds", "allreduces_per_step", "expected_expert_rows",
           "expert_pick_probs", "moe_layer_work", "skips_dense_mlp"]
