"""Model shapes as plain data (gpt-fast style presets).

Shapes are the published Hugging Face configs (config.json) of each model; the comment above each
entry names the hub repository whose config.json it copies.

Mixture-of-experts models set ``num_experts`` (routed experts per layer), ``experts_per_token``
(top-k), ``expert_intermediate`` (each expert's SwiGLU width) and ``shared_expert_intermediate``
(an always-active dense expert, 0 = none); their dense ``intermediate`` is 0 when every layer is a
MoE layer. The MoE model shipped is **Qwen3-30B-A3B** rather than Mixtral-8x7B: with 128 fine-grained
experts and top-8 routing, which experts a step touches (and so how many expert weights it reads)
depends on the batch — the regime a grouped-GEMM cost model has to get right — whereas Mixtral's
8 experts with top-2 are all active from a handful of tokens on and price almost like a dense model.

Tensor parallelism (``tp`` GPUs per replica, Megatron-style as in vLLM) is a transformation of the
shape: :meth:`ModelShape.shard` gives one GPU's part (query and KV heads, MLP and expert columns and
the embedding and LM head rows (``vocab_per_gpu``) divided by ``tp``; hidden size, head size and ``G`` unchanged; norms and the MoE router
replicated). The cost model prices that per-GPU shape plus the all-reduces its ``tp`` implies
(granisim/costmodel/parallel.py). ``tp`` must divide the query and KV heads: we do not replicate KV
heads when ``tp > n_kv_heads`` (vLLM does); such a ``tp`` is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
_DTYPE_OF_BYTES = {1: "fp8", 2: "bf16", 4: "fp32"}  # a measured table records bytes; op work needs only those
# the shape numbers a measured linear or kernel table records (its ``model`` field in a profile)
TABLE_SHAPE_KEYS = ("hidden", "n_q_heads", "n_kv_heads", "head_dim", "intermediate", "vocab", "dtype_bytes")


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    num_layers: int
    hidden: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str = "bf16"
    qkv_bias: bool = False
    tied_embeddings: bool = False
    # mixture of experts (0 = dense): routed experts, top-k, each expert's width, the shared expert's width
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_expert_intermediate: int = 0
    # routing assumption of the cost model (a scenario field: model.expert_routing, model.expert_zipf_s)
    expert_routing: str = "uniform"
    expert_zipf_s: float = 1.0
    # tensor parallelism: this shape is one GPU's shard of a replica of ``tp`` GPUs (1 = the whole model)
    tp: int = 1

    @property
    def vocab_per_gpu(self) -> int:
        """Rows of the vocabulary-parallel embedding and LM head one GPU holds (``vocab`` stays the model's:
        token ids range over all of it)."""
        return -(-self.vocab // self.tp)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def group_size(self) -> int:
        """G: query heads per KV head."""
        return self.n_q_heads // self.n_kv_heads

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V rows of one token across all layers."""
        return 2 * self.num_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def table_shape(self) -> dict[str, int]:
        """The numbers a table measured on this model records (:data:`TABLE_SHAPE_KEYS`)."""
        return {k: int(getattr(self, k)) for k in TABLE_SHAPE_KEYS}

    @property
    def num_params(self) -> int:
        h, q, kv, d = self.hidden, self.n_q_heads, self.n_kv_heads, self.head_dim
        attn = h * (q * d) + 2 * h * (kv * d) + (q * d) * h
        mlp = 3 * h * self.intermediate
        if self.is_moe:  # routed experts (SwiGLU each), the router (h x E), the shared expert (in intermediate)
            mlp += self.num_experts * 3 * h * self.expert_intermediate + h * self.num_experts
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_per_gpu * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def shard_error(self, tp: int) -> str | None:
        """Why this model cannot be split over ``tp`` GPUs (None if it can)."""
        if tp not in (1, 2, 4, 8):
            return "must be 1, 2, 4 or 8"
        for what, n in (("query heads", self.n_q_heads), ("KV heads", self.n_kv_heads)):
            if n % tp:
                fits = [t for t in (1, 2, 4, 8) if self.n_q_heads % t == 0 and self.n_kv_heads % t == 0]
                return (f"does not divide the {n} {what} of {self.name} (heads are split, not replicated; "
                        f"use tp = {' or '.join(map(str, fits))})")
        for what, n in (("MLP intermediate size", self.intermediate), ("expert intermediate size",
                                                                        self.expert_intermediate)):
            if n % tp:
                return f"does not divide the {what} {n} of {self.name}"
        return None

    def shard(self, tp: int) -> "ModelShape":
        """One GPU's part of the model on a replica of ``tp`` GPUs (column/row-parallel linears,
        vocabulary-parallel embedding and LM head). ``shard(1)`` is the model itself."""
        if tp == 1:
            return self
        why = self.shard_error(tp)
        if why is not None:
            raise ValueError(f"tp = {tp} {why}")
        return replace(self, n_q_heads=self.n_q_heads // tp, n_kv_heads=self.n_kv_heads // tp,
                       intermediate=self.intermediate // tp, expert_intermediate=self.expert_intermediate // tp,
                       shared_expert_intermediate=self.shared_expert_intermediate // tp,
                       tp=self.tp * tp)


def measured_shape(dims: Mapping[str, int], name: str = "measured") -> ModelShape:
    """The one-layer shape a table was measured at, from its ``model`` field (:data:`TABLE_SHAPE_KEYS`)."""
    d = {k: int(dims[k]) for k in TABLE_SHAPE_KEYS}
    b = d.pop("dtype_bytes")
    why = table_dtype_error(b)
    if why:
        raise ValueError(f"dtype_bytes = {b}: {why}")
    return ModelShape(name, 1, dtype=_DTYPE_OF_BYTES[b], **d)


def table_dtype_error(dtype_bytes) -> str | None:
    """Why a table's ``dtype_bytes`` names no dtype (None if it does)."""
    return None if dtype_bytes in _DTYPE_OF_BYTES else f"must be one of {sorted(_DTYPE_OF_BYTES)}"


MODELS: dict[str, ModelShape] = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    # Qwen/Qwen2.5-14B config.json
    "qwen-2.5-14b": ModelShape("qwen-2.5-14b", 48, 5120, 40, 8, 128, 13824, 152064, qkv_bias=True),
    # Qwen/Qwen2.5-32B config.json
    "qwen-2.5-32b": ModelShape("qwen-2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, qkv_bias=True),
    # meta-llama/Llama-3.1-70B config.json
    "llama-3.1-70b": ModelShape("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    # Qwen/Qwen2.5-72B config.json
    "qwen-2.5-72b": ModelShape("qwen-2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, qkv_bias=True),
    # Qwen/Qwen3-30B-A3B config.json: every layer MoE (decoder_sparse_step 1, no mlp_only_layers), 128 experts,
    # top-8, moe_intermediate_size 768, no shared expert; head_dim 128 (q_proj 4096 wide > hidden 2048).
    # Its per-head q/k RMSNorms are not priced (a few bytes per token).
    "qwen3-30b-a3b": ModelShape("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 0, 151936, num_experts=128,
                                experts_per_token=8, expert_intermediate=768),
    # A tiny shape for CPU correctness tests of the real engine (not a published model).
    "tiny": ModelShape("tiny", 2, 128, 4, 1, 32, 256, 512, dtype="fp32"),
    # Tiny, with heads (4 query, 2 KV) and MLP that split over 2 GPUs: the tensor-parallel engine's CPU test.
    "tiny-tp": ModelShape("tiny-tp", 2, 128, 4, 2, 32, 256, 512, dtype="fp32"),
}


def get_model(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def kv_budget_tokens(model: ModelShape, gpu_mem_bytes: float, mem_fraction: float, reserve_bytes: float) -> int:
    """KV tokens that fit: GPU memory x fraction - weights - reserve (activations, workspace)."""
    free = gpu_mem_bytes * mem_fraction - model.weight_bytes - reserve_bytes
    if not free > 0:  # also -inf (a reserve near the float maximum), whose floor division is NaN
        return 0
    return int(free // model.kv_bytes_per_token)
