"""Per (profile, model) constants and the memoised part times of a step (CostTables)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from granisim.config.coefficients import LINEAR_KNOTS
from granisim.config.hardware import HardwareProfile
from granisim.config.models import ModelShape, measured_shape

from .correction import page_eff, storage_class
from .kernels import KernelForms
from .operators import (_MEMO_MAX, ELEMENTWISE_FAMILIES, ENGINE_KEYS, GEMM_FAMILIES, LAYER_OPS, STEP_OPS,
                        op_work, roofline_time)
from .parallel import ParallelPricing, skips_dense_mlp
from .step import StepPricing


# engine keys whose offset is a gap per launch of a per-layer kernel: it scales with the layers
# (engine.fit_layers), the linear part's offsets by step size too (the engine's per-layer norms, rotary,
# activation and their launches; on the H200 Qwen-2.5-14B's linear part was priced 1.5% low at every decode
# size without it, within 1% with it: reports/validation/current_engine/). Not lm_head (once a step).
PER_LAYER_KEYS = ("linear", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write")
PREFILL_SMALL_TILE = 64  # rows (and KV tokens) of a prefill tile below attn.prefill.m_tile rows: gpu_backend.kernels.extend


def _gemm_dims(m: ModelShape) -> np.ndarray:
    """(K, N) of one GPU's QKV, O, gate/up and down projections (the table's GEMMs), flattened."""
    h, q, kv, d, inter = m.hidden, m.n_q_heads, m.n_kv_heads, m.head_dim, m.intermediate
    return np.array([h, (q + 2 * kv) * d, q * d, h, h, 2 * inter, inter, h], float)


def nearest_linear_table(profile: HardwareProfile, model: ModelShape) -> tuple[tuple, Mapping, ModelShape]:
    """(num_tokens, ops_ms, per-GPU shape) of the measured linear timings nearest ``model``'s per-GPU shape.

    The candidates are every table of the profile (``linear_table``, then ``more_linear_tables``) at tp = 1 and
    at each tp of its per-shard rows (measured at the table's shape sharded by that tp, such as Vidur's TP rows).
    The nearest is the one whose per-GPU GEMMs are closest in shape: the sum over the four GEMMs' K and N of
    |log(model's / candidate's)| (a GEMM's efficiency depends on its dimensions, not only on their product).
    A table measured at the model's own per-GPU shape is thus used as measured (ratio 1), the others are
    carried by roofline ratios from the closest one. Ties go to the earlier candidate (pure)."""
    want = np.maximum(_gemm_dims(model), 1.0)
    best, best_d = None, math.inf
    for table in (profile.linear_table, *profile.more_linear_tables):
        shape = measured_shape(table.model, "linear table")
        for tp, (ns, ops) in ((1, (table.num_tokens, table.ops_ms)), *sorted(table.tp_ops.items())):
            if len(ns) < 2 or (tp > 1 and shape.shard_error(tp)):  # a table of shard rows alone has no tp = 1
                continue
            ref = shape.shard(tp)
            d = float(np.abs(np.log(want / np.maximum(_gemm_dims(ref), 1.0))).sum())
            if d < best_d - 1e-12:
                best, best_d = (ns, ops, ref), d
    return best


def carried_s(col_ms, family: str, n, ref: ModelShape, model: ModelShape, peak: float, bw: float) -> np.ndarray:
    """Seconds of one operator of ``model`` at ``n`` tokens from a table column measured at shape ``ref``
    (``col_ms``: ms at the same ``n``), carried by the ratio of the family's roofline times (pure)."""
    fm, bm = op_work(family, n, model)
    fr, br = op_work(family, n, ref)
    ratio = np.maximum(fm / peak, bm / bw) / np.maximum(fr / peak, br / bw)
    return np.asarray(col_ms) * 1e-3 * ratio


class CostTables(KernelForms, StepPricing, ParallelPricing):
    """Constants of one (profile, model) pair, and memoised pieces of the step cost."""

    def __init__(self, profile: HardwareProfile, model: ModelShape, use_table: bool = True):
        self.profile, self.model = profile, model
        # measured factors by policy and class of step (step_classes.py), or None: priced as the model says
        self.step_classes = profile.step_classes.for_model(model.name, model.tp) if profile.step_classes else None
        self.corr: dict = {}
        self._priv_class = "slots"  # kernel-table storage class of the plan's private KV (set per step)
        p = profile
        self.P, self.BW, self.sms = p.bf16_flops, p.hbm_bandwidth, p.sm_count
        self.layers = model.num_layers
        self.n_q, self.n_kv, self.d, self.G = model.n_q_heads, model.n_kv_heads, model.head_dim, model.group_size
        self.b = model.dtype_bytes
        self.kvb = 2 * self.n_kv * self.d * self.b  # K+V bytes per token per layer
        self.launch = p["overhead.kernel_launch_s"]
        self.step_overhead = p["overhead.step_s"]
        self.overhead_req = p["overhead.per_request_s"]
        self.overhead_tok = p["overhead.per_kv_token_s"]
        self.overhead_pass = p["overhead.per_pass_s"]
        self.rebuild = p["overhead.rebuild_s"]  # a step not derived from the one before (host_build.py)
        self.reread = p["attn.decode.shared_reread"]
        # (scale, offset) per key; empty when the profile carries no engine calibration (the usual case)
        fit_layers = p["engine.fit_layers"]
        per_layer = {k: model.num_layers / fit_layers if fit_layers and k in PER_LAYER_KEYS else 1.0
                     for k in ENGINE_KEYS}
        engine = {k: (p[f"engine.{k}.scale"], p[f"engine.{k}.offset_s"] * per_layer[k]) for k in ENGINE_KEYS}
        eager = {k: (p[f"engine.eager.{k}.scale"], p[f"engine.eager.{k}.offset_s"] * per_layer[k]) for k in ENGINE_KEYS}
        self.graph_max = int(p["engine.graph_max_tokens"])  # steps over it: the eager set
        self.engine = engine if any(v != (1.0, 0.0) for v in (*engine.values(), *eager.values())) else {}
        self.engine_eager = eager if self.graph_max else engine
        self.eager_floor = {"linear": p["engine.eager.linear_floor_s"]}  # per key: at least this long
        # eager steps prefilling several requests: (gain, share where all read cached context) of their
        # prefill attention's factor (correction.multi_prefill_factor)
        self.pf_multi = (p["engine.eager.attn_prefill.multi_gain"], p["engine.eager.attn_prefill.multi_cached"])
        # prefill attention between a step's GEMMs: (self scale, context scale, context per 1000 tokens), or None
        in_step = tuple(p[f"engine.attn_in_step.{k}"] for k in ("self_scale", "context_scale", "context_per_ktok"))
        self.attn_in_step = in_step if in_step != (1.0, 1.0, 0.0) else None
        knots = [n for n in LINEAR_KNOTS if f"engine.linear.offset_t{n}_s" in p.coefficients]
        self.linear_knots = (np.log2(knots), np.array([p[f"engine.linear.offset_t{n}_s"] for n in knots])
                             * per_layer["linear"]) \
            if knots else None
        self._memo_lin_off: dict[int, float] = {}
        self.fam = {f: (p[f"linear.{f}.launch_s"],
                        p[f"linear.{f}.flop_eff"] if f in GEMM_FAMILIES else 1.0,
                        p[f"linear.{f}.mem_eff"]) for f in GEMM_FAMILIES + ELEMENTWISE_FAMILIES}
        self.page1, self.page16, self.slab = p["storage.page1_eff"], p["storage.page16_eff"], p["storage.slab_eff"]
        L = self.layers
        # prefill
        self.pf_mt = int(p["attn.prefill.m_tile"])
        self.pf_a = L / (self.P * p["attn.prefill.flop_eff"])  # s per FLOP of one layer, all layers
        self.pf_b = L / (self.BW * p["attn.prefill.mem_eff"])
        self.pf_launch = L * self.launch
        # decode: per token of KV read
        dec_rows = math.ceil(self.G / p["attn.decode.m_tile"]) * p["attn.decode.m_tile"]
        self.dec_f_tok = 4.0 * self.n_kv * dec_rows * self.d * L / (self.P * p["attn.decode.flop_eff"])
        self.dec_b_tok = self.kvb * L / (self.BW * p["attn.decode.mem_eff"])
        self.dec_qo = 2.0 * self.n_q * self.d * self.b * L / (self.BW * p["attn.decode.mem_eff"])
        self.dec_launch = L * self.launch
        # merge, KV movement
        self.merge_row = self.n_q * (2 * (self.d + 1) * 4 + self.d * self.b) * L / (self.BW * p["attn.merge.mem_eff"])
        self.merge_launch = L * self.launch
        self.kvw_tok = 2.0 * self.kvb * L / (self.BW * p["kv.write_eff"])
        self.kvw_launch = L * self.launch
        self.copy_tok = 2.0 * self.kvb * L / (self.BW * p["kv.copy_eff"])
        self.form = int(p["attn.form"])
        self.copy_launch = L * (p["kv.copy_launch_s"] if self.form == 2 else self.launch)
        if self.form == 2:
            self._init_form2()
            if use_table and profile.kernel_table is not None:
                self.corr = self._build_corrections(profile.kernel_table)
        self._init_parallel()
        self._lin_grid = self._build_linear_grid()
        self._memo_lin: dict[int, float] = {}
        self._memo_head: dict[int, float] = {}
        self._memo_prefix: dict[tuple, float] = {}
        self._memo_inv: dict[tuple, float] = {}


    # -- storage -------------------------------------------------------------------------------
    def storage_eff(self, storage: str | None, page_size: int) -> float:
        """Fraction of the contiguous read rate: the slab's, else :func:`page_eff` of the storage."""
        return self.slab if storage == "slab" else page_eff(storage, page_size, self.page1, self.page16)

    def _inv_eff(self, storage: str | None, page_size: int) -> float:
        key = (storage, page_size)
        v = self._memo_inv.get(key)
        if v is None:
            v = self._memo_inv[key] = 1.0 / self.storage_eff(storage, page_size)
        return v

    # -- linear operators ----------------------------------------------------------------------
    def _family_time(self, family: str, n):
        launch, ef, em = self.fam[family]
        f, by = op_work(family, n, self.model)
        return roofline_time(f, by, self.P, self.BW, launch, ef, em)

    def _build_linear_grid(self):
        """(n grid, seconds per step for all layers) when the profile has a linear table."""
        if self.profile.linear_table is None:
            return None
        ns, ops_ms, ref = nearest_linear_table(self.profile, self.model)
        n = np.asarray(ns, float)
        total = np.zeros_like(n)
        for ops, mult in ((LAYER_OPS, self.layers), (STEP_OPS, 1)):
            for family, col, count in ops:
                if skips_dense_mlp(self.model, family):
                    continue
                total += carried_s(ops_ms[col], family, n, ref, self.model, self.P, self.BW) * count * mult
        # GEMMs at tile-aligned sizes run faster than at slightly smaller ones (n = 48 beats 40):
        # a step of n tokens costs no more than the cheapest measured size >= n (pad up to it),
        # so more tokens are never cheaper.
        return n, np.minimum.accumulate(total[::-1])[::-1]

    def linear_time(self, tokens: int) -> float:
        """All linear/element-wise operators of one step over ``tokens`` new tokens (no LM head)."""
        v = self._memo_lin.get(tokens)
        if v is not None:
            return v
        if tokens <= 0:
            v = 0.0
        elif self._lin_grid is not None:
            n, t = self._lin_grid
            if tokens >= n[-1]:
                v = float(t[-1] * tokens / n[-1])
            elif tokens <= n[0]:
                v = float(t[0] * tokens / n[0])
            else:
                v = float(np.interp(tokens, n, t))
        else:
            v = 0.0
            for ops, mult in ((LAYER_OPS, self.layers), (STEP_OPS, 1)):
                for family, _, count in ops:
                    if skips_dense_mlp(self.model, family):
                        continue
                    v += float(self._family_time(family, tokens)) * count * mult
        if self.has_parallel:  # tp > 1: the all-reduces; MoE: the expert layers (granisim/costmodel/parallel.py)
            v += self.parallel_time(tokens)
        if len(self._memo_lin) > _MEMO_MAX:
            self._memo_lin.clear()
        self._memo_lin[tokens] = v
        return v

    def lm_head_time(self, rows: int) -> float:
        v = self._memo_head.get(rows)
        if v is None:
            v = 0.0 if rows <= 0 else float(self._family_time("lm_head", rows))
            if self.tp > 1:
                v += self.logits_gather_time(rows)
            if len(self._memo_head) > _MEMO_MAX:
                self._memo_head.clear()
            self._memo_head[rows] = v
        return v

    # -- prefix pass -----------------------------------------------------------------------------
    def prefix_time_array(self, path: str, prefix_len: int, m_eff, storage: str = "slab", page_size: int = 1,
                          splits=None):
        """Seconds (all layers) of one group's prefix pass; ``m_eff`` may be a numpy array. ``splits``: the
        (n_splits, chunk) measured launches ran (calibration rows; form 2 only), else the split rule's."""
        p = self.profile
        if path == "dense" and storage != "slab":
            raise ValueError(f"path 'dense' needs a HOT slab, got storage {storage!r}")
        if path not in ("dense", "cascade"):
            raise ValueError(f"prefix pass path must be 'dense' or 'cascade', got {path!r}")
        m = np.asarray(m_eff, float)
        L = float(prefix_len)
        if self.form == 2:
            t = self.prefix_time2(path, L, np.atleast_1d(m), 1.0 / self.storage_eff(storage, page_size),
                                  gather=storage != "slab", cls=storage_class(storage, page_size), splits=splits)
            t = t.reshape(m.shape) if m.ndim else t[0]
            return np.where(L > 0, t, 0.0)
        mt = p[f"attn.{path}.m_tile"]
        tiles = np.maximum(1.0, np.ceil(m / mt))
        flops = 4.0 * tiles * mt * self.n_kv * self.d * L
        kv_bytes = tiles * L * self.kvb / self.storage_eff(storage, page_size)
        q_bytes = m * self.n_kv * self.d * self.b
        out_bytes = m * self.n_kv * (self.d + 1) * 4.0
        ctas = self.n_kv * tiles
        if path == "cascade":
            splits = np.maximum(1.0, np.minimum(np.ceil(p["attn.cascade.ctas_per_sm"] * self.sms / ctas),
                                                math.ceil(L / p["attn.cascade.min_split_tokens"])))
            split = splits > 1
            nbytes = kv_bytes + q_bytes + out_bytes + np.where(split, 2.0 * splits * out_bytes, 0.0)
            launches = np.where(split, p["attn.cascade.launches"], 1.0)
            occ = 1.0
        else:
            nbytes = kv_bytes + q_bytes + out_bytes
            launches = p["attn.dense.launches"]
            occ = np.minimum(1.0, ctas / self.sms)
        t = np.maximum(flops / (self.P * p[f"attn.{path}.flop_eff"]),
                       nbytes / (self.BW * p[f"attn.{path}.mem_eff"])) / occ
        t = self.layers * (t + launches * self.launch)
        return np.where(L > 0, t, 0.0)

    def prefix_pass_time(self, path: str, groups: tuple, storage: str = "slab", page_size: int = 1) -> float:
        """Seconds (all layers) of one stacked prefix pass over ``groups`` ((prefix_len, m_eff) pairs) in
        one storage; form 1 prices the groups one by one."""
        key = (path, groups, storage, page_size)
        v = self._memo_prefix.get(key)
        if v is None:
            live = [(L, m) for L, m in groups if L > 0]
            if not live:
                v = 0.0
            elif self.form == 2:
                v = self.prefix_pass_time2(path, [L for L, _ in live], [m for _, m in live],
                                           1.0 / self.storage_eff(storage, page_size), gather=storage != "slab",
                                           cls=storage_class(storage, page_size))
            else:
                v = sum(self.prefix_time(path, L, m, storage, page_size) for L, m in live)
            if len(self._memo_prefix) > _MEMO_MAX:
                self._memo_prefix.clear()
            self._memo_prefix[key] = v
        return v

    def prefix_time(self, path: str, prefix_len: int, m_eff: int, storage: str = "slab", page_size: int = 1) -> float:
        key = (path, prefix_len, m_eff, storage, page_size)
        v = self._memo_prefix.get(key)
        if v is None:
            v = float(self.prefix_time_array(path, prefix_len, m_eff, storage, page_size))
            if len(self._memo_prefix) > _MEMO_MAX:
                self._memo_prefix.clear()
            self._memo_prefix[key] = v
        return v

    # -- prefill ----------------------------------------------------------------------------------
    def prefill_tile(self, longest):
        """Row (and KV) tile of a prefill launch whose longest chunk is ``longest`` tokens: ``attn.prefill.m_tile``
        once that chunk stacks as many rows per KV head, else the small tile (gpu_backend.kernels.extend
        default_tiles; arrays broadcast)."""
        if self.form != 2:
            return self.pf_mt
        small = min(self.pf_mt, PREFILL_SMALL_TILE)
        if np.ndim(longest) == 0:  # one launch, priced every step: no array round trip
            return self.pf_mt if longest * self.G >= self.pf_mt else small
        return np.where(np.asarray(longest) * self.G >= self.pf_mt, self.pf_mt, small)

    def prefill_time(self, reqs, inv_priv: float, ginv: list, correct: bool = True) -> float:
        f = bts = pb = praw = 0.0
        tiles = nreq = T = ctx = 0
        mt = self.prefill_tile(max((r.num_new for r in reqs), default=0))
        for r in reqs:
            q, c = r.num_new, r.context_len
            if q <= 0:
                continue
            s = r.shared_len if r.group >= 0 else 0
            inv_s = ginv[r.group] if s else 0.0
            nt, fi, bi, pbi, prawi = self._prefill_terms(q, c, max(c, 1), (c - s) * inv_priv + s * inv_s, math.ceil,
                                                         mt)
            nreq += 1
            T += q
            ctx += c
            tiles += nt
            f += fi
            bts += bi
            pb += pbi
            praw += prawi
        if self.form == 2:
            return float(self._prefill_kernel2(f, pb / max(praw, 1e-30), praw, tiles, T, ctx / nreq if nreq else 0,
                                               correct and nreq, mt))
        return max(f * self.pf_a, bts * self.pf_b) + self.pf_launch

    def prefill_time_uniform(self, q, c, n_req, inv_priv: float, correct: bool = True):
        """Seconds (all layers, attn.form 2) of prefills of ``n_req`` alike requests, each ``q`` new tokens over
        ``c`` private context tokens (arrays broadcast): what ``prefill_time`` gives for such a batch."""
        if self.form != 2:
            raise ValueError(f"prefill_time_uniform: attn.form {self.form} (form 2 only)")
        q, c, n = (np.asarray(x, float) for x in (q, c, n_req))
        mt = self.prefill_tile(q)
        nt, f, _, pb, praw = self._prefill_terms(q, c, np.maximum(c, 1.0), c * inv_priv, np.ceil, mt)
        return self._prefill_kernel2(n * f, pb / praw, n * praw, n * nt, n * q, c, correct, mt)

    def _prefill_terms(self, q, c, c_or_1, kv_eff, ceil, mt):
        """One prefill request of ``q`` new tokens over ``c`` context tokens (``c_or_1``: max(c, 1); ``kv_eff``:
        its context tokens weighted by their storage's inverse efficiency) in a launch of ``mt``-row tiles (its KV
        tiles as long): (row tiles, FLOPs, bytes, KV its programs stream weighted and raw). Python numbers or
        arrays (``ceil``: math.ceil or np.ceil)."""
        rows = q * self.G
        nt = ceil(rows / mt)
        pad = nt * mt / rows
        f = 4.0 * self.d * self.n_q * (q * c + q * (q + 1) / 2.0) * pad
        bts = self.kvb * (kv_eff + q) + 2.0 * q * self.n_q * self.d * self.b
        # KV each of its programs streams: the prefix in whole KV tiles, half the chunk on average
        pc = ceil(c / mt) * mt
        return nt, f, bts, nt * (pc * kv_eff / c_or_1 + q / 2.0), nt * (pc + q / 2.0)

    def _prefill_kernel2(self, f, inv_eff, praw, tiles, T, ctx_mean, correct, mt):
        """Seconds (all layers) of the form-2 prefill kernel over ``tiles`` row tiles of ``mt`` rows (arrays
        broadcast)."""
        N = tiles * self.n_kv
        t = self.kernel_time2("prefill", N, f / N, praw * 2.0 * self.d * self.b / tiles, inv_eff=inv_eff,
                              first_bytes=mt * 2.0 * self.d * self.b)
        if correct and self.corr:
            t = t * self._corr("prefill", self._priv_class, np.log2(T), np.log2(ctx_mean + 1.0))
        return self.layers * t
