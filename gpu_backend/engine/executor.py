"""The GPU executor: runs a batch plan through a model-shaped forward on real KV buffers.

Implements the same protocol as the simulator's CostExecutor (granisim.plan.Executor):
``execute(plan) -> StepResult`` with the step's measured duration, a breakdown under the
cost model's keys, and the greedy next token of every request in the plan.

Per layer: RMSNorm, QKV projection (+ bias for Qwen), RoPE, KV write into the plan's
slots, attention by the plan's path for each row — extend (prefill chunks over their
cached prefix), per-request decode (`paged` path, and requests outside any group), or a
group prefix pass (`cascade`/`dense`) + suffix pass + LSE merge — then the output
projection and the SwiGLU MLP. Finally norm, LM head on each request's last row, argmax.
"""
from __future__ import annotations

import torch

from granisim.models import ModelShape
from granisim.plan import BatchPlan, StepResult

from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from ..kernels.dense import dense_prefix_attention
from ..kernels.extend import extend_attention
from ..kernels.kv_write import write_kv
from ..kernels.merge import merge_states
from . import metadata
from .model import RandomWeights, logits, mlp, qkv_proj, rope_tables
from .timing import PartTimer


class GpuExecutor:
    needs_layouts = True
    max_steps_per_plan = 1

    def __init__(self, shape: ModelShape, num_slots: int, *, device="cuda", dtype: torch.dtype | None = None,
                 seed: int = 0, keep_logits: bool = False):
        self.shape = shape
        self.device = torch.device(device)
        self.w = RandomWeights(shape, device=self.device, dtype=dtype, seed=seed)
        self.num_slots = int(num_slots)
        kv_shape = (self.num_slots, shape.n_kv_heads, shape.head_dim)
        self.k_cache = [torch.zeros(kv_shape, dtype=self.w.dtype, device=self.device) for _ in range(shape.num_layers)]
        self.v_cache = [torch.zeros(kv_shape, dtype=self.w.dtype, device=self.device) for _ in range(shape.num_layers)]
        self.keep_logits = keep_logits
        self.last_logits: dict[int, torch.Tensor] = {}

    # ---- the step ---------------------------------------------------------------------------
    def execute(self, plan: BatchPlan) -> StepResult:
        if plan.num_steps != 1:
            raise ValueError(f"the GPU executor runs one step per plan, got num_steps={plan.num_steps}")
        timer = PartTimer(self.device)
        timer.start()
        self._check_copies(plan)
        meta = metadata.build(plan, self.device, self.num_slots)
        if plan.copies:
            with timer.part("kv_copy"):
                self._apply_copies(plan)
        w = self.w
        with timer.part("lm_head"):
            x = w.embed[meta.tokens]
            rot = rope_tables(meta.positions, w.inv_freq)
        for li, layer in enumerate(w.layers):
            with timer.part("linear"):
                q, k, v = qkv_proj(w, layer, x, rot)
            with timer.part("kv_write"):
                write_kv(k_cache=self.k_cache[li], v_cache=self.v_cache[li], k=k, v=v, slots=meta.new_slots,
                         check=False)
            attn = self._attention(meta, q, k, v, li, timer)
            with timer.part("linear"):
                x = x + attn.reshape(meta.num_tokens, -1) @ layer.wo
                x = x + mlp(layer, x)
        with timer.part("lm_head"):
            lg = logits(w, x[meta.last_rows])
            nxt = lg.argmax(dim=-1).cpu()
        total, parts = timer.stop()
        parts["overhead"] = max(0.0, total - sum(parts.values()))
        rids = [r.rid for r in plan.requests]
        if self.keep_logits:
            self.last_logits = {rid: lg[i].cpu() for i, rid in enumerate(rids)}
        return StepResult(total, parts, {rid: int(t) for rid, t in zip(rids, nxt.tolist())})

    def _attention(self, meta: metadata.StepMeta, q, k, v, li: int, timer: PartTimer) -> torch.Tensor:
        kc, vc = self.k_cache[li], self.v_cache[li]
        out = torch.empty_like(q)
        check = False  # metadata.build validated every slot id on the host: no device reads here
        if meta.extend_rows is not None:
            with timer.part("attn_prefill"):
                r = meta.extend_rows
                o, _ = extend_attention(q=q[r], k_new=k[r], v_new=v[r], qo_indptr=meta.extend_indptr, k_cache=kc,
                                        v_cache=vc, prefix=meta.extend_prefix, max_qo_len=meta.extend_max_qo,
                                        check=check)
                out[r] = o
        if meta.decode_rows is not None:
            with timer.part("attn_decode"):
                r = meta.decode_rows
                o, _ = decode_attention(q=q[r], k_cache=kc, v_cache=vc, kv=meta.decode_kv,
                                        max_kv_len=meta.decode_max_kv, check=check)
                out[r] = o
        if meta.grouped_rows is not None:
            pre_o, pre_lse = [], []
            with timer.part("attn_prefix"):
                for p in meta.prefix_passes:
                    fn = dense_prefix_attention if p.path == "dense" else cascade_prefix_attention
                    o, lse = fn(q=q[p.rows], k_cache=kc, v_cache=vc, group_indptr=p.group_indptr, prefix=p.prefix,
                                max_group_size=p.max_group, max_kv_len=p.max_prefix, check=check)
                    pre_o.append(o)
                    pre_lse.append(lse)
            r = meta.grouped_rows
            with timer.part("attn_decode"):
                so, slse = decode_attention(q=q[r], k_cache=kc, v_cache=vc, kv=meta.suffix_kv,
                                            max_kv_len=meta.suffix_max_kv, check=check)
            with timer.part("merge"):
                o, _ = merge_states(o1=torch.cat(pre_o), lse1=torch.cat(pre_lse), o2=so, lse2=slse)
                out[r] = o
        return out

    # ---- compaction copies ---------------------------------------------------------------------
    def _check_copies(self, plan: BatchPlan) -> None:
        for c in plan.copies:
            if min(c.src, c.dst) < 0 or max(c.src, c.dst) + c.length > self.num_slots or c.length < 0:
                raise ValueError(f"plan step {plan.step}: KV copy {c} runs outside the buffer of {self.num_slots} slots")

    def _apply_copies(self, plan: BatchPlan) -> None:
        for c in plan.copies:  # in order: each destination lies at or before its source
            for cache in (*self.k_cache, *self.v_cache):
                cache[c.dst : c.dst + c.length] = cache[c.src : c.src + c.length].clone()
