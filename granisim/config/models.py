"""Model shapes as plain data (gpt-fast style presets).

Shapes are the published Hugging Face configs (config.json) of each model.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


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

    @property
    def num_params(self) -> int:
        h, q, kv, d = self.hidden, self.n_q_heads, self.n_kv_heads, self.head_dim
        attn = h * (q * d) + 2 * h * (kv * d) + (q * d) * h
        mlp = 3 * h * self.intermediate
        per_layer = attn + mlp + 2 * h
        emb = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


MODELS: dict[str, ModelShape] = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    # Qwen/Qwen2.5-14B config.json
    "qwen-2.5-14b": ModelShape("qwen-2.5-14b", 48, 5120, 40, 8, 128, 13824, 152064, qkv_bias=True),
    # Qwen/Qwen2.5-32B config.json
    "qwen-2.5-32b": ModelShape("qwen-2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, qkv_bias=True),
    # A tiny shape for CPU correctness tests of the real engine (not a published model).
    "tiny": ModelShape("tiny", 2, 128, 4, 1, 32, 256, 512, dtype="fp32"),
}


def get_model(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def kv_budget_tokens(model: ModelShape, gpu_mem_bytes: float, mem_fraction: float, reserve_bytes: float) -> int:
    """KV tokens that fit: GPU memory x fraction - weights - reserve (activations, workspace)."""
    free = gpu_mem_bytes * mem_fraction - model.weight_bytes - reserve_bytes
    return max(0, int(free // model.kv_bytes_per_token))
