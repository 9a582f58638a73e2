"""The GPU executor: runs a batch plan through a model-shaped forward on real KV buffers.

Implements the same protocol as the simulator's CostExecutor (granisim.core.contract.Executor):
``execute(plan) -> StepResult`` with the step's measured duration, a breakdown under the
cost model's keys, and the greedy next token of every request in the plan.

Per layer: RMSNorm, QKV projection (+ bias for Qwen), RoPE, KV write into the plan's
slots, attention by region (rows.py) — extend for prefill chunks over their cached prefix,
per-request decode (`paged` path and requests outside any group), and per prefix pass the
group prefix attention (`cascade`/`dense`) + one suffix decode + LSE merge — then the
output projection and the SwiGLU MLP. Finally norm, LM head on each request's last row, argmax.

Steps of up to `graph_max_rows` rows run as CUDA-graph replays (graphs.py, one per step
shape); larger steps (long prefill chunks, GPU-bound anyway) and every step on the CPU run
eagerly. The limit is GRAPH_MAX_ROWS = 2048 by default; `stats()` reports it, and the engine
calibration reads it from there into the profile (`engine.graph_max_tokens`). Launched eagerly, a mixed step of ~1K prefill rows plus decodes is
host-bound (~1,000 launches), and its time then follows the host's speed, which drifts within
a run; from ~2K rows the GEMMs keep the GPU ahead of the host (reports/validation/).

A step's duration is CUDA-event time from before its metadata is built to after
its last kernel: host metadata work and the GPU work, not the scheduler, and none of the
one-offs an engine warmed up before serving would not pay (each counted in `stats()`):
- a graph's capture and first launch (a one-off per shape; the first launch uploads the graph);
- growing the metadata buffers (arena.py: device and pinned host allocations) and retiring
  the captured graphs it makes stale (destroying them and their memory pool; they are
  captured again, each a one-off as above);
- Triton building or loading a kernel variant in an eager step (the step is re-run and the
  re-run timed; `reruns`);
- Python's garbage collector: collections are held off during a step (`hold_gc`) and run
  after it, outside the clock (`gc_*`; timing.GcWatch says why).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from granisim.config.models import ModelShape
from granisim.core.contract import BatchPlan, StepResult

from . import metadata, rows
from .arena import MetaArena
from .graphs import GraphCache
from .launches import StepLaunches
from .model import FusedLayers, RandomWeights, TorchLayers, logits, rope_tables
from .request_table import RequestTable
from .timing import AllocWatch, CompileWatch, GcWatch, PartTimer, elapsed
from .transfers import HostKV, apply_copies_and_transfers

GRAPH_MAX_ROWS = 2048  # steps of more rows run eagerly (see the module docstring)


class GpuExecutor:
    needs_layouts = True
    max_steps_per_plan = 1
    reduce = None  # tensor parallelism (tp.py): the all-reduce after each row-parallel projection

    def __init__(self, shape: ModelShape, num_slots: int, *, device="cuda", dtype: torch.dtype | None = None,
                 seed: int = 0, keep_logits: bool = False, graphs: bool | None = None, graph_max_rows: int = GRAPH_MAX_ROWS,
                 hold_gc: bool = True, watch_allocs: bool = False, weights: RandomWeights | None = None,
                 host_tokens: int = 0, request_table: bool = True, small_in_graph: bool = False,
                 fused_elementwise: bool = False, fold_merge: bool = False):
        self.shape = shape
        self.device = torch.device(device)
        # ``weights``: drawn by the caller (a tensor-parallel rank's slice of the full model's, tp.py)
        self.w = weights or RandomWeights(shape, device=self.device, dtype=dtype, seed=seed)
        self.num_slots = int(num_slots)
        self.idled_s = 0.0  # wall-clock seconds spent in idle()
        # one scratch slot past the budget: padded rows write their K/V there; nothing reads it
        kv_shape = (self.num_slots + 1, shape.n_kv_heads, shape.head_dim)
        self.k_cache = [torch.zeros(kv_shape, dtype=self.w.dtype, device=self.device) for _ in range(shape.num_layers)]
        self.v_cache = [torch.zeros(kv_shape, dtype=self.w.dtype, device=self.device) for _ in range(shape.num_layers)]
        self.keep_logits = keep_logits
        # host-tier K/V (transfers.py) for ``host_tokens`` host slots, allocated here: no step pays for it
        self.host_kv = (HostKV(shape.num_layers, shape.n_kv_heads, shape.head_dim, self.w.dtype, self.device,
                               host_tokens) if host_tokens else None)
        self.last_logits: dict[int, torch.Tensor] = {}
        self.arena = MetaArena(self.device)
        # decode and suffix rows read their ids from a device table the steps extend (request_table.py), else the
        # ids are listed afresh each step
        self.table = RequestTable() if request_table else None
        use_graphs = self.device.type == "cuda" if graphs is None else graphs
        if use_graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.graphs = GraphCache(self.device) if use_graphs else None
        # `small_in_graph`: a graph step's fixed-size metadata is copied by the graph's first node, not by a copy the
        # host launches (off by default until measured: the shipped profiles' host terms are fitted without it)
        self.small_in_graph = small_in_graph
        # `fused_elementwise`: the layers' element-wise work in three Triton kernels (model.FusedLayers); off by
        # default until measured and calibrated: the shipped profiles price the torch ops
        self.layers = FusedLayers if fused_elementwise else TorchLayers
        # `fold_merge`: a prefix pass's combine merges the suffix half in (no merge launch; launches.py); off by
        # default until measured: the shipped profiles price the merge on its own
        self.fold_merge = fold_merge
        self.graph_max_rows = graph_max_rows
        self.eager_steps = 0
        self.reruns = 0
        self.growth_s = 0.0  # device-timeline seconds of metadata-buffer growths (with graph retirement)
        self.hold_gc = hold_gc
        CompileWatch.install()
        GcWatch.install()
        self._gc_start = dict(GcWatch.totals)
        self._allocs = AllocWatch(self.device, watch_allocs)  # a diagnostic: two memory_stats() reads a step

    def stats(self) -> dict:
        g = self.graphs
        return dict(idled_s=round(self.idled_s, 3), graph_max_rows=self.graph_max_rows if g else 0,
                    eager_steps=self.eager_steps, reruns=self.reruns,
                    graph_replays=g.replays if g else 0,
                    graph_captures=g.captures if g else 0, capture_s=round(g.capture_s, 3) if g else 0.0,
                    small_in_graph=bool(g) and self.small_in_graph,
                    fused_elementwise=self.layers is FusedLayers, fold_merge=self.fold_merge,
                    arena_growths=self.arena.growths, growth_s=round(self.growth_s, 4),
                    hold_gc=self.hold_gc, **GcWatch.since(self._gc_start), **self._allocs.stats(),
                    **self._table_stats(), **self._host_stats())

    def _table_stats(self) -> dict:
        t = self.table
        return dict(request_table=t is not None, **({} if t is None else dict(
            table_resets=t.resets, table_patched_entries=t.patched, table_entries=t.end)))

    def _host_stats(self) -> dict:
        h = self.host_kv
        return {} if h is None else dict(host_slab_copies=h.slab_copies, host_page_copies=h.page_copies,
                                         host_link_copies=h.host_copies)

    def idle(self, seconds: float) -> None:
        """Wait out a gap between arrivals in wall-clock time (the serving loop calls this when it has no
        step to run): the GPU finishes its queued work, then idles as a server's would between requests,
        so its clock and power state between bursts are a server's, not those of steps run back to back."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.idled_s += seconds
        time.sleep(seconds)

    # ---- the step ---------------------------------------------------------------------------
    def execute(self, plan: BatchPlan) -> StepResult:
        with GcWatch.hold(self.hold_gc), self._allocs.step(plan.step):
            return self._step(plan)

    def _step(self, plan: BatchPlan) -> StepResult:
        if plan.num_steps != 1:
            raise ValueError(f"the GPU executor runs one step per plan, got num_steps={plan.num_steps}")
        self._check_copies(plan)
        clock = PartTimer(self.device)
        t0 = clock.mark()
        graph = self.graphs is not None and plan.num_tokens <= self.graph_max_rows
        host = rows.build(plan, self.num_slots, pad=graph, table=self.table)
        pauses = []  # one-offs kept off the step's clock: (start, end) marks
        growth = None
        if not self.arena.fits(host):  # bigger metadata buffers: allocations no later step of this size pays
            a = clock.mark()
            self.arena.reserve(host)
            if self.graphs is not None:
                self.graphs.retire_stale(self.arena.generation)
            growth = (a, clock.mark())
            pauses.append(growth)
        copy_small = graph and self.small_in_graph  # the graph copies the fixed-size fields in
        meta = metadata.upload(host, self.arena, small_later=copy_small)
        parts = {}
        if plan.copies or plan.transfers:
            a = clock.mark()
            if plan.transfers:  # host tier: copies and transfers in the allocator's order (transfers.py)
                if self.host_kv is None:
                    raise ValueError("the plan moves KV to or from host, but this executor was built without a "
                                     "host tier (host_tokens = 0)")
                apply_copies_and_transfers(plan, self.k_cache, self.v_cache, self.host_kv)
            else:
                self._apply_copies(plan)
            copy_span = (a, clock.mark())
        if graph:
            entry = self.graphs.lookup(host.shape, self.arena.generation)
            if entry is None:  # capture, its warm-up run and the graph's first launch are not part of the step
                a = clock.mark()
                entry = self.graphs.capture(host.shape, lambda timer: self._forward(meta, timer, copy_small))
                pauses.append((a, clock.mark()))
            nxt, lg = self.graphs.replay(entry)
            timer = entry.timer
        else:
            a, built = clock.mark(), CompileWatch.count
            timer = PartTimer(self.device)
            nxt, lg = self._forward(meta, timer)
            self.eager_steps += 1
            if CompileWatch.count != built:
                # a kernel variant was built or loaded inside the step: time a re-run instead (same
                # inputs, same K/V written to the same slots, same outputs)
                pauses.append((a, clock.mark()))
                timer = PartTimer(self.device)
                nxt, lg = self._forward(meta, timer)
                self.reruns += 1
        t1 = clock.mark()
        nxt = nxt.cpu()  # waits for the step
        total = elapsed(t0, t1) - sum(elapsed(*p) for p in pauses)
        if growth:
            self.growth_s += elapsed(*growth)
        parts.update(timer.parts())
        if plan.copies or plan.transfers:
            parts["kv_copy"] = elapsed(*copy_span)
        parts["overhead"] = max(0.0, total - sum(parts.values()))
        if self.keep_logits:
            self.last_logits = {rid: lg[i].cpu() for rid, i in host.sample_of.items()}
        sampled = nxt.tolist()  # one conversion, not a tensor index per request
        return StepResult(total, parts, {rid: sampled[i] for rid, i in host.sample_of.items()})

    def _forward(self, m: metadata.StepMeta, timer: PartTimer,
                 copy_small: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The whole step on the device: no host reads, shapes from `m.shape` only (graph-capturable). `copy_small`:
        first copy the staged fixed-size metadata in (a graph's first node; on the step's clock as host part)."""
        w = self.w
        if copy_small:
            self.arena.copy_small(m.small_ids)
        run = StepLaunches(m, self.shape, w.dtype, self.device, self.fold_merge)  # host work once per step
        if m.table is not None:
            timer.switch("kv_write")
            metadata.append_new_tokens(m)
        timer.switch("linear")
        dense = self.layers(w, F.embedding(m.tokens, w.embed), self.reduce)  # all-reduces under tensor parallelism
        rot = rope_tables(m.positions, w.inv_freq, w.dtype)
        for li, layer in enumerate(w.layers):
            timer.switch("linear")
            q, k, v = dense.attn_in(layer, rot)
            timer.switch("kv_write")
            run.write(self.k_cache[li], self.v_cache[li], k, v, m.new_slots)
            attn = self._attention(run, m.shape, q, k, v, li, timer)
            timer.switch("linear")
            dense.attn_out_mlp(layer, attn)
        x = dense.final(m.sample_rows)
        timer.switch("lm_head")
        lg = logits(w, x)
        nxt = lg.argmax(dim=-1)
        timer.switch(None)
        return nxt, (lg if self.keep_logits else None)  # a graph's outputs stay allocated: keep them small

    def _attention(self, run: StepLaunches, s: rows.StepShape, q, k, v, li: int, timer: PartTimer) -> torch.Tensor:
        """Attention by region into `run.out` (rows.py: extend rows, decode rows, then grouped rows)."""
        kc, vc, out = self.k_cache[li], self.v_cache[li], run.out
        a, b = 0, s.ext_rows
        if run.extend:
            timer.switch("attn_prefill")
            run.extend(q[a:b], k[a:b], v[a:b], kc, vc, out[a:b], run.ext_lse)
        a, b = b, b + s.dec_rows
        if run.decode:
            timer.switch("attn_decode")
            run.decode(q[a:b], kc, vc, out[a:b], run.dec_lse)
        if not run.passes:
            return out
        a, b = b, b + s.grouped_rows
        if run.merge is None:  # fold_merge: the suffix first, then each prefix pass's combine merges it in
            timer.switch("attn_decode")
            run.suffix(q[a:b], kc, vc, run.suf_o, run.suf_lse)
            timer.switch("attn_prefix")
            for p in run.passes:
                p.launch(q[a + p.lo: a + p.hi], kc, vc, out[a + p.lo: a + p.hi], run.merged_lse[p.lo:p.hi],
                         (run.suf_o[p.lo:p.hi], run.suf_lse[p.lo:p.hi]))
            return out
        timer.switch("attn_prefix")
        for p in run.passes:
            p.launch(q[a + p.lo: a + p.hi], kc, vc, run.pre_o[p.lo:p.hi], run.pre_lse[p.lo:p.hi])
        timer.switch("attn_decode")
        run.suffix(q[a:b], kc, vc, run.suf_o, run.suf_lse)
        timer.switch("merge")
        run.merge(run.pre_o, run.pre_lse, run.suf_o, run.suf_lse, out[a:b], run.merged_lse)
        return out

    # ---- compaction copies ---------------------------------------------------------------------
    def _check_copies(self, plan: BatchPlan) -> None:
        for c in plan.copies:
            if min(c.src, c.dst) < 0 or max(c.src, c.dst) + c.length > self.num_slots or c.length < 0:
                raise ValueError(f"plan step {plan.step}: KV copy {c} runs outside the buffer of {self.num_slots} slots")

    def _apply_copies(self, plan: BatchPlan) -> None:
        for c in plan.copies:  # in order: each destination lies at or before its source
            for cache in (*self.k_cache, *self.v_cache):
                cache[c.dst: c.dst + c.length] = cache[c.src: c.src + c.length].clone()
