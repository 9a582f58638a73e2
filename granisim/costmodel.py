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
    padded to ``attn.prefill.m_tile``; ``F = 4 d n_q (q c + q (q+1) / 2) * pad``,
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

import math
from dataclasses import dataclass

import numpy as np

from granisim.hardware import HardwareProfile
from granisim.models import ModelShape
from granisim.plan import BatchPlan, StepResult

BREAKDOWN_KEYS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge",
                  "kv_write", "kv_copy", "overhead")
GEMM_FAMILIES = ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "lm_head")
ENGINE_KEYS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write")
ELEMENTWISE_FAMILIES = ("mlp_act", "norm", "rope", "add", "embedding")

# (family, table column, count) per layer, and per step (embedding, final norm).
LAYER_OPS = (("qkv_proj", "attn_pre_proj", 1), ("o_proj", "attn_post_proj", 1),
             ("mlp_up", "mlp_up_proj", 1), ("mlp_act", "mlp_act", 1), ("mlp_down", "mlp_down_proj", 1),
             ("norm", "input_layernorm", 1), ("norm", "post_attention_layernorm", 1),
             ("rope", "attn_rope", 1), ("add", "add", 2))
STEP_OPS = (("embedding", "emb", 1), ("norm", "input_layernorm", 1))

_MEMO_MAX = 200_000


# ---- operator work ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Dims:
    """The shape numbers the linear operators need."""

    hidden: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int

    @classmethod
    def of(cls, model: ModelShape) -> "Dims":
        return cls(model.hidden, model.n_q_heads, model.n_kv_heads, model.head_dim,
                   model.intermediate, model.vocab, model.dtype_bytes)


def op_work(family: str, n, dims: Dims):
    """(FLOPs, bytes) of one instance of an operator family over ``n`` tokens (rows).

    ``n`` may be a number or a numpy array. GEMMs count weights once plus activations in and out.
    """
    h, q, kv, d, inter, vocab, b = (dims.hidden, dims.n_q_heads, dims.n_kv_heads, dims.head_dim,
                                    dims.intermediate, dims.vocab, dims.dtype_bytes)
    gemm = {"qkv_proj": (h, (q + 2 * kv) * d), "o_proj": (q * d, h), "mlp_up": (h, 2 * inter),
            "mlp_down": (inter, h), "lm_head": (h, vocab)}
    if family in gemm:
        k, m = gemm[family]
        return 2.0 * n * k * m, float(b) * (k * m + n * (k + m))
    elementwise = {"mlp_act": 3 * inter, "norm": 2 * h, "rope": 2 * (q + kv) * d, "add": 3 * h,
                   "embedding": 2 * h}
    if family in elementwise:
        return 0.0 * n, float(b) * n * elementwise[family] + (b * h if family == "norm" else 0.0)
    raise ValueError(f"unknown operator family {family!r}")


def roofline_time(flops, nbytes, peak_flops: float, bandwidth: float, launch_s: float = 0.0,
                  flop_eff: float = 1.0, mem_eff: float = 1.0):
    """``launch_s + max(flops / (peak_flops * flop_eff), nbytes / (bandwidth * mem_eff))``."""
    return launch_s + np.maximum(flops / (peak_flops * flop_eff), nbytes / (bandwidth * mem_eff))


def fit_roofline(flops, nbytes, seconds, peak_flops: float, bandwidth: float,
                 max_launch_s: float | None = None) -> tuple[float, float, float]:
    """Least-squares fit (relative error) of ``(launch_s, flop_eff, mem_eff)`` in :func:`roofline_time`.

    Grid search over the two efficiencies (log-spaced, refined twice around the best point),
    ``0 <= launch_s <= max_launch_s`` solved in closed form for each. With all ``flops == 0``
    ``flop_eff`` is returned as 1.0. Bounding the launch keeps the fit physical: an unbounded
    one absorbs the smooth memory->compute transition of GEMMs into a large constant that would
    not carry over to another GPU.
    """
    f = np.asarray(flops, float)
    by = np.asarray(nbytes, float)
    t = np.asarray(seconds, float)
    w = 1.0 / t**2

    def launch_for(m):  # m [..., N] modelled time without launch -> best launch >= 0
        return np.clip(((t - m) * w).sum(-1) / w.sum(), 0.0, max_launch_s)

    def loss(m, c):
        return (((c[..., None] + m - t) / t) ** 2).sum(-1)

    lo, hi = np.log(1e-3), 0.0
    if not np.any(f > 0):
        grid = np.linspace(lo, hi, 400)
        for _ in range(3):
            em = np.exp(grid)
            m = by[None, :] / (bandwidth * em[:, None])
            c = launch_for(m)
            i = int(np.argmin(loss(m, c)))
            step = grid[1] - grid[0]
            best = (float(c[i]), 1.0, float(em[i]))
            grid = np.linspace(max(lo, grid[i] - 2 * step), min(hi, grid[i] + 2 * step), 400)
        return best
    gf = np.linspace(lo, hi, 120)
    gm = np.linspace(lo, hi, 120)
    for _ in range(3):
        ef, em = np.exp(gf), np.exp(gm)
        m = np.maximum(f[None, None, :] / (peak_flops * ef[:, None, None]),
                       by[None, None, :] / (bandwidth * em[None, :, None]))
        c = launch_for(m)
        err = loss(m, c)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        best = (float(c[i, j]), float(ef[i]), float(em[j]))
        sf, sm = gf[1] - gf[0], gm[1] - gm[0]
        gf = np.linspace(max(lo, gf[i] - 2 * sf), min(hi, gf[i] + 2 * sf), 120)
        gm = np.linspace(max(lo, gm[j] - 2 * sm), min(hi, gm[j] + 2 * sm), 120)
    return best


# ---- measured corrections (form 2 with a kernel table) -----------------------------------------
class Correction:
    """A multiplicative correction ``exp(r(x[, y]))`` from scattered points ``(x, y, r)`` (log2 axes):
    linear along ``y`` within each measured ``x`` column, then linear across columns, tabulated on a
    regular grid and read back bilinearly; constant beyond the measured range (clamped)."""

    def __init__(self, x, r, y=None, n: int = 65):
        x, r = np.asarray(x, float), np.asarray(r, float)
        ux = np.unique(x)
        self.gx = np.linspace(ux[0], ux[-1], n) if ux.size > 1 else ux
        if y is None:
            rr = np.array([r[x == u].mean() for u in ux])
            self.grid = np.interp(self.gx, ux, rr)[:, None]
            self.gy = np.zeros(1)
            return
        y = np.asarray(y, float)
        uy = np.unique(y)
        self.gy = np.linspace(uy[0], uy[-1], n) if uy.size > 1 else uy
        cols = []
        for u in ux:
            m = x == u
            yy = np.unique(y[m])
            rr = np.array([r[m][y[m] == v].mean() for v in yy])
            cols.append(np.interp(self.gy, yy, rr))
        cols = np.asarray(cols)  # [len(ux), len(gy)]
        self.grid = np.stack([np.interp(self.gx, ux, cols[:, j]) for j in range(self.gy.size)], axis=1)

    @staticmethod
    def _pos(g, v):
        if g.size == 1:
            return np.zeros_like(v, dtype=int), np.zeros_like(v, dtype=float)
        f = np.clip((v - g[0]) / (g[1] - g[0]), 0.0, g.size - 1.0)
        i = np.minimum(f.astype(int), g.size - 2)
        return i, f - i

    def __call__(self, x, y=None):
        x = np.asarray(x, float)
        y = np.zeros_like(x) if y is None else np.asarray(y, float)
        x, y = np.broadcast_arrays(x, y)
        i, fx = self._pos(self.gx, x)
        j, fy = self._pos(self.gy, y)
        g = self.grid
        i1 = np.minimum(i + 1, g.shape[0] - 1)
        j1 = np.minimum(j + 1, g.shape[1] - 1)
        v = ((1 - fx) * (1 - fy) * g[i, j] + fx * (1 - fy) * g[i1, j]
             + (1 - fx) * fy * g[i, j1] + fx * fy * g[i1, j1])
        return np.exp(v)


def _storage_class(storage, page_size) -> str:
    """The kernel-table storage a plan's storage reads like: 'slab', 'slots' (page 1), 'pages16'."""
    if storage == "slab":
        return "slab"
    if storage in ("cold", "token", "hot") or page_size < 4:
        return "slots"
    return "pages16"


# ---- per (profile, model) constants ------------------------------------------------------------
class CostTables:
    """Constants of one (profile, model) pair, and memoised pieces of the step cost."""

    def __init__(self, profile: HardwareProfile, model: ModelShape, use_table: bool = True):
        self.profile, self.model = profile, model
        self.corr: dict = {}
        self._priv_class = "slots"  # kernel-table storage class of the plan's private KV (set per step)
        p = profile
        self.P, self.BW, self.sms = p.bf16_flops, p.hbm_bandwidth, p.sm_count
        self.layers = model.num_layers
        self.n_q, self.n_kv, self.d, self.G = model.n_q_heads, model.n_kv_heads, model.head_dim, model.group_size
        self.b = model.dtype_bytes
        self.kvb = 2 * self.n_kv * self.d * self.b  # K+V bytes per token per layer
        self.dims = Dims.of(model)
        self.launch = p["overhead.kernel_launch_s"]
        self.step_overhead = p["overhead.step_s"]
        self.overhead_req = p["overhead.per_request_s"]
        self.overhead_tok = p["overhead.per_kv_token_s"]
        # (scale, offset) per key; empty when the profile carries no engine calibration (the usual case)
        engine = {k: (p[f"engine.{k}.scale"], p[f"engine.{k}.offset_s"]) for k in ENGINE_KEYS}
        eager = {k: (p[f"engine.eager.{k}.scale"], p[f"engine.eager.{k}.offset_s"]) for k in ENGINE_KEYS}
        self.graph_max = int(p["engine.graph_max_tokens"])  # steps over it: the eager set
        self.engine = engine if any(v != (1.0, 0.0) for v in (*engine.values(), *eager.values())) else {}
        self.engine_eager = eager if self.graph_max else engine
        self.eager_floor = p["engine.eager.linear_floor_s"]
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
        self.copy_launch = L * self.launch
        self.form = int(p["attn.form"])
        if self.form == 2:
            self._init_form2()
            if use_table and profile.kernel_table is not None:
                self.corr = self._build_corrections(profile.kernel_table)
        self._lin_grid = self._build_linear_grid()
        self._memo_lin: dict[int, float] = {}
        self._memo_head: dict[int, float] = {}
        self._memo_prefix: dict[tuple, float] = {}
        self._memo_inv: dict[tuple, float] = {}

    # -- form 2: the Triton kernels' own launch rules, a wave model of their programs ------------------
    def _init_form2(self):
        p, L = self.profile, self.layers
        self.f2 = {}
        for fam, pre, flop, mem in (("prefill", "attn.prefill.", "attn.prefill.flop_eff", "attn.prefill.mem_eff"),
                                    ("decode", "attn.decode.", "attn.decode.flop_eff", "attn.decode.mem_eff"),
                                    ("cascade", "attn.cascade.", "attn.cascade.flop_eff", "attn.cascade.mem_eff"),
                                    ("dense", "attn.dense.", "attn.dense.flop_eff", "attn.dense.mem_eff"),
                                    ("merge", "attn.merge.", None, "attn.merge.mem_eff"),
                                    ("kv_write", "kv.write_", None, "kv.write_eff")):
            self.f2[fam] = (p[pre + "launch_s"], p[pre + "program_s"], p[flop] if flop else 1.0, p[mem],
                            p[pre + "sat_ctas_per_sm"], max(1.0, float(p[pre + "resident_ctas_per_sm"])))
        self.ctas_per_sm = p["attn.cascade.ctas_per_sm"]
        self.gather_ctas_per_sm = p["attn.cascade.gather_ctas_per_sm"]
        self.min_split = p["attn.cascade.min_split_tokens"]
        self.max_splits = p["attn.cascade.max_splits"]
        self.balance_chunk = p["attn.cascade.balance_chunk"]
        self.balance_factor = p["attn.cascade.balance_mean_factor"]
        self.dense_max_splits = int(p["attn.dense.max_splits"])
        self.merge_eff_bw = self.BW * p["attn.merge.mem_eff"]
        self.copy_launch = L * p["kv.copy_launch_s"]
        self.dec_tile = float(min(128, max(p["attn.decode.m_tile"], 1 << max(0, math.ceil(math.log2(self.G))))))
        # merge: 64-row programs, o1, o2, out in the model dtype + three fp32 LSEs per (token, head) row
        self.merge_row_bytes = 3.0 * self.d * self.b + 12.0
        self.merge_block = float(max(1, min(64, 8192 // self.d)))
        # KV write: programs of 4096 // next_pow2(n_kv * d) tokens, K and V rows read and written
        self.kvw_block = float(max(1, 4096 // (1 << math.ceil(math.log2(self.n_kv * self.d)))))
        self._memo_small: dict[tuple, float] = {}
        self.pf_page1, self.pf_page16 = p["attn.prefill.page1_eff"], p["attn.prefill.page16_eff"]

    def prefill_inv_eff(self, storage, page_size: int) -> float:
        """Form 2: 1 / the extend kernel's own gather efficiency for this storage."""
        if storage == "slab":
            return 1.0
        if storage in ("cold", "token", "hot"):
            page_size = 1
        x = min(1.0, math.log2(max(1, page_size)) / 4.0)
        return 1.0 / (self.pf_page1 + (self.pf_page16 - self.pf_page1) * x)

    @staticmethod
    def _block_n(m_tile):
        """KV tile of the launchers: 64 tokens for row tiles up to 64, else 128."""
        return np.where(np.asarray(m_tile) <= 64, 64.0, 128.0)

    def split_rule(self, base, kv_len, block_n, gather=False, mean_len=None):
        """(n_splits, chunk) of gpu_backend.kernels.split_kv.launch / plan_splits: split along KV until
        about ``ctas_per_sm`` programs per SM would run, rounded down (slabs, 128-row tiles), or
        ``gather_ctas_per_sm`` rounded up (gathered storage with row tiles <= 64: ``gather`` True), and
        (given the batch's ``mean_len``) until no split is longer than
        ``max(balance_chunk, balance_mean_factor * mean_len)``;
        at least ``min_split_tokens`` per split, at most ``max_splits``; the chunk is a whole number of
        KV tiles. Arrays broadcast."""
        base = np.maximum(np.asarray(base, float), 1.0)
        kv_len = np.asarray(kv_len, float)
        want = np.where(gather, np.ceil(self.gather_ctas_per_sm * self.sms / base),
                        np.maximum(1.0, np.floor(self.ctas_per_sm * self.sms / base)))
        if self.balance_chunk and mean_len is not None:
            cap = np.maximum(self.balance_chunk, self.balance_factor * np.ceil(mean_len))
            want = np.maximum(want, np.ceil(kv_len / cap))
        n = np.maximum(1.0, np.minimum(np.minimum(want, np.ceil(kv_len / self.min_split)), self.max_splits))
        chunk = np.ceil(np.ceil(kv_len / n) / block_n) * block_n
        chunk = np.where(kv_len > 0, chunk, block_n)
        return np.where(kv_len > 0, np.ceil(kv_len / chunk), 1.0), chunk

    def dense_split_rule(self, base, kv_len, block_n=128.0):
        """(n_splits, chunk) of gpu_backend.kernels.dense._dense_splits: of 1..max_splits, the split
        count whose last wave is fullest per unit of work (first minimum of
        ``waves * (chunk + block_n) + 0.02 * n * L / 8``)."""
        base = np.asarray(base, float)
        L = float(kv_len)
        if L <= 0 or self.dense_max_splits <= 1:
            return np.ones_like(base), np.full_like(base, max(L, block_n))
        s = np.arange(1, self.dense_max_splits + 1, dtype=float)[:, None]
        chunk = np.ceil(np.ceil(L / s) / block_n) * block_n
        n = np.ceil(L / chunk)
        waves = np.ceil(base[None, :] * n / self.sms)
        cost = waves * (chunk + block_n) + 0.02 * n * L / 8
        i = np.argmin(cost, axis=0)
        return n[i, 0] + 0.0 * base, chunk[i, 0] + 0.0 * base

    def kernel_time2(self, fam, programs, flops_prog, bytes_prog, launches=1.0, partial_bytes=0.0, inv_eff=1.0,
                     first_bytes=0.0):
        """Seconds (one layer) of one kernel of family ``fam`` (wave model; arrays broadcast).

        ``programs`` programs, each doing ``flops_prog`` / ``bytes_prog``. An SM runs
        ``resident_ctas_per_sm`` programs at once: ``waves = ceil(programs / (sm_count * resident))``.
        ``n`` programs running together share the GPU: one computes at ``bf16_flops * flop_eff /
        max(sm_count, n)`` and streams at ``hbm_bandwidth * mem_eff / max(sm_count * sat_ctas_per_sm / e, n)``
        where ``e = 1 / inv_eff`` is the storage's gather efficiency: a gather slows one program's stream
        (dependent index loads: latency), not the GPU's bandwidth once enough programs share it; a
        program's first KV tile (``first_bytes``) arrives while its prologue runs.
        A program's fixed work (``program_s``) does not overlap with other programs' on its SM.
        ``t = launches * launch_s + program_s * max(1, programs / sm_count) + waves * max(compute, stream)
        + partial_bytes / merge rate``.
        """
        launch, prog, ef, em, sat, res = self.f2[fam]
        N = np.maximum(np.asarray(programs, float), 1.0)
        slots = self.sms * res
        waves = np.ceil(N / slots)
        conc = np.minimum(N, slots)
        comp = flops_prog * np.maximum(self.sms, conc) / (self.P * ef)
        # one program streams at most BW * em / (sms * sat) (its first KV tile arrives during the prologue);
        # together they share BW * em
        mem = np.maximum((bytes_prog - first_bytes) * self.sms * sat * inv_eff, bytes_prog * conc) / (self.BW * em)
        # the per-program fixed work is issue-bound: one SM retires programs' prologues one after another
        over = prog * np.maximum(1.0, N / self.sms)
        return launches * launch + over + waves * np.maximum(comp, mem) + partial_bytes / self.merge_eff_bw

    def decode_time2(self, tok, n_dec, max_len, nbytes, gather=True, raw_bytes=None):
        """Seconds (all layers) of the decode kernel over ``n_dec`` requests reading ``tok`` KV tokens
        (``nbytes`` bytes per layer, gathers included), longest ``max_len`` tokens; ``gather``: the KV is
        in page tables / slot lists (the simulator's private storage), not slabs; arrays broadcast."""
        base = self.n_kv * np.asarray(n_dec, float)  # one row tile (G query heads) per request and KV head
        n, _ = self.split_rule(base, max_len, 64.0, gather=np.logical_and(gather, self.dec_tile <= 64),
                               mean_len=np.asarray(tok, float) / np.maximum(n_dec, 1))
        N = base * n
        tok = np.asarray(tok, float)
        per = tok * self.n_kv / N                      # mean KV tokens of one program
        pad = np.ceil(per / 64.0) * 64.0 / np.maximum(per, 1e-9)  # a program streams whole 64-token tiles
        flops = 4.0 * self.dec_tile * self.d * per * pad
        split = n > 1
        partial = np.where(split, 2.0 * n * n_dec * self.n_q * (self.d + 1) * 4.0, 0.0)
        raw = nbytes if raw_bytes is None else raw_bytes
        t = self.kernel_time2("decode", N, flops, raw / N * pad, np.where(split, 2.0, 1.0), partial,
                              inv_eff=nbytes / np.maximum(raw, 1e-30), first_bytes=64.0 * 2.0 * self.d * self.b)
        if self.corr:
            t = t * self._corr("decode", "slab" if not np.any(gather) else self._priv_class,
                               np.log2(np.maximum(n_dec, 1)), np.log2(np.maximum(tok / np.maximum(n_dec, 1), 1.0)))
        return self.layers * t

    def prefix_time2(self, path, L, m, inv_eff, gather=False, cls=None):
        """Form 2 of :meth:`prefix_time_array` (m: numpy array of M_eff; ``cls``: kernel-table storage
        class for the measured correction, None = none)."""
        p = self.profile
        if path == "cascade":
            pow2 = 2.0 ** np.ceil(np.log2(np.maximum(m, 1.0)))
            bm = np.clip(pow2, p["attn.cascade.min_m_tile"], p["attn.cascade.m_tile"])
        else:
            bm = np.full_like(m, p["attn.dense.m_tile"])
        bn = self._block_n(bm)
        tiles = np.maximum(1.0, np.ceil(m / bm))
        base = tiles * self.n_kv
        if path == "cascade":
            n, chunk = self.split_rule(base, L, bn, gather=np.logical_and(gather, bm <= 64))
        else:
            n, chunk = self.dense_split_rule(base, L, float(bn.flat[0]) if bn.size else 128.0)
        c = chunk  # tokens of one program, whole KV tiles
        flops = 4.0 * bm * self.d * c
        nbytes = c * 2.0 * self.d * self.b + bm * self.d * self.b
        rows = m * self.n_kv
        split = n > 1
        partial = np.where(split, 2.0 * n * rows * (self.d + 1) * 4.0, 0.0)
        t = self.kernel_time2(path, base * n, flops, nbytes, np.where(split, 2.0, 1.0), partial, inv_eff=inv_eff,
                              first_bytes=bn * 2.0 * self.d * self.b)
        if cls is not None and self.corr:
            t = t * self._corr(path, cls, np.log2(np.maximum(m, 1.0)), np.log2(max(L, 1.0)))
        return self.layers * t

    def prefix_pass_time2(self, path, Ls, ms, inv_eff, gather=False, cls=None):
        """Seconds (all layers) of ONE launch over several groups' prefixes, as the engine runs a step's
        groups of one (path, storage): the grid is sized by the largest group (row tiles) and the longest
        prefix (splits, balanced by the mean length); programs past a group's rows or prefix exit at
        once; the others share the GPU (``Ls`` prefix lengths, ``ms`` M_eff per group)."""
        p = self.profile
        Ls, ms = np.asarray(Ls, float), np.asarray(ms, float)
        if path == "cascade":
            bm = float(np.clip(2.0 ** np.ceil(np.log2(max(ms.max(), 1.0))), p["attn.cascade.min_m_tile"],
                               p["attn.cascade.m_tile"]))
        else:
            bm = float(p["attn.dense.m_tile"])
        bn = 64.0 if bm <= 64 else 128.0
        tiles = np.maximum(1.0, np.ceil(ms / bm))
        base = float(tiles.max()) * self.n_kv * len(Ls)
        if path == "cascade":
            n, chunk = self.split_rule(base, Ls.max(), bn, gather=gather and bm <= 64, mean_len=Ls.mean())
        else:
            n, chunk = self.dense_split_rule(np.array([base]), Ls.max(), bn)
        n, chunk = float(np.asarray(n).flat[0]), float(np.asarray(chunk).flat[0])
        active = float((tiles * self.n_kv * np.ceil(Ls / chunk)).sum())    # programs with KV to stream
        per = float((tiles * self.n_kv * Ls).sum()) / active                # their mean tokens
        flops = 4.0 * bm * self.d * per
        nbytes = per * 2.0 * self.d * self.b + bm * self.d * self.b
        partial = 2.0 * n * float(ms.sum()) * self.n_kv * (self.d + 1) * 4.0 if n > 1 else 0.0
        t = self.kernel_time2(path, active, flops, nbytes, 2.0 if n > 1 else 1.0, partial, inv_eff=inv_eff,
                              first_bytes=bn * 2.0 * self.d * self.b)
        if cls is not None and self.corr:
            t = t * self._corr(path, cls, np.log2(max(ms.mean(), 1.0)), np.log2(max(Ls.mean(), 1.0)))
        return self.layers * float(t)

    def _build_corrections(self, table) -> dict:
        """Correction functions (measured / formula) per (family, storage class) from a kernel table."""
        from dataclasses import replace

        rows = table.rows
        ref = ModelShape("table", 1, int(table.model["hidden"]), int(table.model["n_kv_heads"]) * 4,
                         int(table.model["n_kv_heads"]), int(table.model["head_dim"]),
                         int(table.model["intermediate"]), int(table.model["vocab"]))
        pts: dict = {}
        tabs: dict = {}
        n = len(rows["family"])
        for i in range(n):
            fam, st = rows["family"][i], rows["storage"][i]
            G = int(rows["G"][i]) or 4
            t = tabs.get(G)
            if t is None:
                t = tabs[G] = CostTables(self.profile, replace(ref, n_q_heads=ref.n_kv_heads * G), use_table=False)
            B, Lk, T = rows["B"][i], rows["L"][i], rows["T"][i]
            cls = st if st in ("slab", "slots", "pages16") else "slots"
            sto, ps = {"slab": ("slab", 1), "slots": ("paged", 1), "pages16": ("paged", 16)}[cls]
            if fam == "decode":
                inv = 1.0 / t.storage_eff(sto, ps)
                tok = B * Lk
                qo = B * 2.0 * t.n_q * t.d * t.b
                f = t.decode_time2(tok, B, Lk, tok * t.kvb * inv + qo, gather=cls != "slab", raw_bytes=tok * t.kvb + qo)
                key, x, y = ("decode", cls), np.log2(B), np.log2(max(Lk, 1.0))
            elif fam in ("cascade", "dense"):
                f = t.prefix_time2(fam, Lk, np.array([rows["M_eff"][i]]), 1.0 / t.storage_eff(sto, ps),
                                   gather=cls != "slab")[0]
                key, x, y = (fam, cls), np.log2(rows["M_eff"][i]), np.log2(max(Lk, 1.0))
            elif fam == "extend":
                q, nr = int(rows["q_len"][i]), int(rows["n_req"][i])
                from types import SimpleNamespace
                reqs = [SimpleNamespace(num_new=q, context_len=int(Lk), shared_len=0, group=-1)] * nr
                f = t.prefill_time(reqs, t.prefill_inv_eff(sto, ps), [], correct=False)
                key, x, y = ("prefill", cls), np.log2(q * nr), np.log2(Lk + 1.0)
            elif fam == "merge":
                f = t.merge_time2(int(T) * t.n_q, correct=False)
                key, x, y = ("merge", ""), np.log2(T * t.n_q), None
            elif fam == "kv_write":
                f = t.kv_write_time2(int(T), correct=False)
                key, x, y = ("kv_write", ""), np.log2(T), None
            else:
                continue
            pts.setdefault(key, []).append((x, y, np.log(rows["median_us"][i] * 1e-6 / float(f))))
        out = {}
        for key, v in pts.items():
            x = [p[0] for p in v]
            r = [p[2] for p in v]
            out[key] = Correction(x, r, None if v[0][1] is None else [p[1] for p in v])
        return out

    def _corr(self, fam, cls, x, y=None):
        c = self.corr.get((fam, cls))
        if c is None and cls != "slab":
            c = self.corr.get((fam, "slots" if cls == "pages16" else "pages16"))
        return 1.0 if c is None else c(x, y)

    def merge_time2(self, rows: int, correct: bool = True) -> float:
        """Seconds (all layers) of the LSE merge over ``rows`` (token, head) rows."""
        key = ("merge", rows, correct)
        v = self._memo_small.get(key)
        if v is None:
            N = math.ceil(rows / self.merge_block)
            v = self.layers * float(self.kernel_time2("merge", N, 0.0, rows / N * self.merge_row_bytes))
            if correct and self.corr:
                v *= float(self._corr("merge", "", np.log2(rows)))
            if len(self._memo_small) > _MEMO_MAX:
                self._memo_small.clear()
            self._memo_small[key] = v
        return v

    def kv_write_time2(self, tokens: int, correct: bool = True) -> float:
        """Seconds (all layers) of writing ``tokens`` tokens' K and V rows into their slots."""
        key = ("kvw", tokens, correct)
        v = self._memo_small.get(key)
        if v is None:
            N = math.ceil(tokens / self.kvw_block)
            v = self.layers * float(self.kernel_time2("kv_write", N, 0.0, tokens / N * 2.0 * self.kvb))
            if correct and self.corr:
                v *= float(self._corr("kv_write", "", np.log2(tokens)))
            if len(self._memo_small) > _MEMO_MAX:
                self._memo_small.clear()
            self._memo_small[key] = v
        return v

    # -- storage -------------------------------------------------------------------------------
    def storage_eff(self, storage: str | None, page_size: int) -> float:
        """Fraction of the contiguous read rate: slab; page size 1 ('cold', 'token', a
        non-contiguous 'hot' run); pages of ``page_size`` ('paged', or None = the plan's private
        storage), interpolated in log2(page size) between page 1 and page 16, flat above 16."""
        if storage == "slab":
            return self.slab
        if storage in ("cold", "token", "hot"):
            page_size = 1
        elif storage not in ("paged", None):
            raise ValueError(f"unknown KV storage {storage!r}; expected slab, cold, token, hot or paged")
        x = min(1.0, math.log2(max(1, page_size)) / 4.0)
        return self.page1 + (self.page16 - self.page1) * x

    def _inv_eff(self, storage: str | None, page_size: int) -> float:
        key = (storage, page_size)
        v = self._memo_inv.get(key)
        if v is None:
            v = self._memo_inv[key] = 1.0 / self.storage_eff(storage, page_size)
        return v

    # -- linear operators ----------------------------------------------------------------------
    def _family_time(self, family: str, n):
        launch, ef, em = self.fam[family]
        f, by = op_work(family, n, self.dims)
        return roofline_time(f, by, self.P, self.BW, launch, ef, em)

    def _build_linear_grid(self):
        """(n grid, seconds per step for all layers) when the profile has a linear table."""
        table = self.profile.linear_table
        if table is None:
            return None
        n = np.asarray(table.num_tokens, float)
        ref = Dims(**{k: int(v) for k, v in table.model.items()})
        total = np.zeros_like(n)
        for ops, mult in ((LAYER_OPS, self.layers), (STEP_OPS, 1)):
            for family, col, count in ops:
                fm, bm = op_work(family, n, self.dims)
                fr, br = op_work(family, n, ref)
                ratio = np.maximum(fm / self.P, bm / self.BW) / np.maximum(fr / self.P, br / self.BW)
                total += np.asarray(table.ops_ms[col]) * 1e-3 * ratio * count * mult
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
                    v += float(self._family_time(family, tokens)) * count * mult
        if len(self._memo_lin) > _MEMO_MAX:
            self._memo_lin.clear()
        self._memo_lin[tokens] = v
        return v

    def lm_head_time(self, rows: int) -> float:
        v = self._memo_head.get(rows)
        if v is None:
            v = 0.0 if rows <= 0 else float(self._family_time("lm_head", rows))
            if len(self._memo_head) > _MEMO_MAX:
                self._memo_head.clear()
            self._memo_head[rows] = v
        return v

    # -- prefix pass -----------------------------------------------------------------------------
    def prefix_time_array(self, path: str, prefix_len: int, m_eff, storage: str = "slab", page_size: int = 1):
        """Seconds (all layers) of one group's prefix pass; ``m_eff`` may be a numpy array."""
        p = self.profile
        if path == "dense" and storage != "slab":
            raise ValueError(f"path 'dense' needs a HOT slab, got storage {storage!r}")
        if path not in ("dense", "cascade"):
            raise ValueError(f"prefix pass path must be 'dense' or 'cascade', got {path!r}")
        m = np.asarray(m_eff, float)
        L = float(prefix_len)
        if self.form == 2:
            t = self.prefix_time2(path, L, np.atleast_1d(m), 1.0 / self.storage_eff(storage, page_size),
                                  gather=storage != "slab", cls=_storage_class(storage, page_size))
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
                                           cls=_storage_class(storage, page_size))
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
    def prefill_time(self, reqs, inv_priv: float, ginv: list, correct: bool = True) -> float:
        G, mt = self.G, self.pf_mt
        f = bts = pb = praw = 0.0
        tiles = nreq = T = ctx = 0
        for r in reqs:
            q, c = r.num_new, r.context_len
            if q <= 0:
                continue
            rows = q * G
            nreq += 1
            T += q
            ctx += c
            nt = math.ceil(rows / mt)
            tiles += nt
            pad = nt * mt / rows
            f += 4.0 * self.d * self.n_q * (q * c + q * (q + 1) / 2.0) * pad
            s = r.shared_len if r.group >= 0 else 0
            inv_s = ginv[r.group] if s else 0.0
            bts += self.kvb * ((c - s) * inv_priv + s * inv_s + q) + 2.0 * q * self.n_q * self.d * self.b
            # KV each of its programs streams: the prefix in whole 64-token tiles, half the chunk on average
            pc = math.ceil(c / 64.0) * 64.0
            pb += nt * (pc * ((c - s) * inv_priv + s * inv_s) / max(c, 1) + q / 2.0)
            praw += nt * (pc + q / 2.0)
        if self.form == 2:
            N = tiles * self.n_kv
            t = float(self.kernel_time2("prefill", N, f / N, praw * 2.0 * self.d * self.b / tiles,
                                        inv_eff=pb / max(praw, 1e-30), first_bytes=64.0 * 2.0 * self.d * self.b))
            if correct and self.corr and nreq:
                t *= float(self._corr("prefill", self._priv_class, np.log2(T), np.log2(ctx / nreq + 1.0)))
            return self.layers * t
        return max(f * self.pf_a, bts * self.pf_b) + self.pf_launch

    # -- the step ---------------------------------------------------------------------------------
    def _in_engine(self, key: str, t, eager: bool = False):
        """Model time -> the real engine's time for one breakdown key (graph-replayed or eager step)."""
        a, b = (self.engine_eager if eager else self.engine)[key]
        return np.where(t > 0, a * t + b, 0.0) if isinstance(t, np.ndarray) else (a * t + b if t > 0 else 0.0)

    def step(self, plan: BatchPlan) -> StepResult:
        page_size = plan.page_size
        if self.corr:
            self._priv_class = _storage_class(None, page_size)
        inv_priv = self._inv_eff(None, page_size)
        # groups: prefix passes now; per-group read factor for members that re-read (paged path)
        ginv = []
        gpaged = []
        passes: dict = {}  # (path, storage) -> groups priced as one launch, as the engine stacks them
        for g in plan.groups:
            ginv.append(self._inv_eff(g.storage, page_size))
            gpaged.append(g.path == "paged")
            if g.path != "paged":
                passes.setdefault((g.path, g.storage), []).append((g.prefix_len, g.m_eff))
        prefix = 0.0
        for (path, storage), groups in passes.items():
            prefix += self.prefix_pass_time(path, tuple(groups), storage, page_size)
        # requests
        T = n_dec = tok = merge_rows = lmax = 0
        tok_s = lmax_s = 0  # members of prefix passes: their suffixes are one more decode launch
        shared_eff = shared_raw = 0.0
        prefill_reqs = None
        for r in plan.requests:
            nn = r.num_new
            T += nn
            if nn == 1 and not r.is_prefill:
                n_dec += 1
                g = r.group
                if g >= 0:
                    s = r.shared_len
                    c = r.context_len + 1 - s
                    tok += c
                    if gpaged[g]:
                        shared_eff += s * ginv[g]
                        shared_raw += s
                        c += s
                    else:
                        merge_rows += 1
                        tok_s += c
                        if c > lmax_s:
                            lmax_s = c
                        continue
                else:
                    c = r.context_len + 1
                    tok += c
                if c > lmax:
                    lmax = c
            elif prefill_reqs is None:
                prefill_reqs = [r]
            else:
                prefill_reqs.append(r)
        n = plan.num_steps
        if n > 1 and prefill_reqs is not None:
            raise ValueError(f"num_steps={n} needs a decode-only plan (step {plan.step} has prefill work)")
        linear = self.linear_time(T)
        lm_head = self.lm_head_time(len(plan.requests))
        if prefill_reqs and self.form == 2:
            attn_prefill = self.prefill_time(prefill_reqs, self.prefill_inv_eff(None, page_size),
                                             [self.prefill_inv_eff(g.storage, page_size) for g in plan.groups])
        else:
            attn_prefill = self.prefill_time(prefill_reqs, inv_priv, ginv) if prefill_reqs else 0.0
        if self.form == 2:
            merge = self.merge_time2(merge_rows * self.n_q) if merge_rows else 0.0
            kv_write = self.kv_write_time2(T) if T else 0.0
        else:
            merge = merge_rows * self.merge_row + self.merge_launch if merge_rows else 0.0
            kv_write = T * self.kvw_tok + self.kvw_launch if T else 0.0
        if plan.copies:
            ctok = sum(c.length for c in plan.copies)
            kv_copy = ctok * self.copy_tok + self.copy_launch
        else:
            kv_copy = 0.0
        overhead = self.step_overhead + self.overhead_req * len(plan.requests) + self.overhead_tok * tok
        eager = bool(self.graph_max) and T > self.graph_max
        if self.engine:
            linear, lm_head, attn_prefill, prefix, merge, kv_write = (
                self._in_engine(k, v, eager) for k, v in (("linear", linear), ("lm_head", lm_head),
                                                   ("attn_prefill", attn_prefill), ("attn_prefix", prefix),
                                                   ("merge", merge), ("kv_write", kv_write)))
            if eager and linear < self.eager_floor:
                linear = self.eager_floor
        if self.form == 2 and n_dec:
            # as the engine launches them: one decode over whole contexts, one over pass members' suffixes
            # (both priced in one vectorised call: rows of the arrays are the launches)
            steps_ = np.arange(max(n, 1), dtype=float)
            rows, t0, lm, s_eff, s_raw = (np.array(c, float)[:, None] for c in zip(*(
                launch for launch in ((n_dec - merge_rows, tok - tok_s, lmax, shared_eff, shared_raw),
                                      (merge_rows, tok_s, lmax_s, 0.0, 0.0)) if launch[0])))
            toks2 = t0 + steps_ * rows
            qo = rows * 2.0 * self.n_q * self.d * self.b
            dec2 = self.decode_time2(toks2, rows, lm + steps_, (toks2 * inv_priv + s_eff) * self.kvb + qo,
                                     raw_bytes=(toks2 + s_raw) * self.kvb + qo).sum(axis=0)
        if n <= 1:
            if n_dec and self.form == 2:
                attn_decode = float(dec2[0])
            elif n_dec:
                attn_decode = max(tok * self.dec_f_tok,
                                  (tok * inv_priv + shared_eff) * self.dec_b_tok + n_dec * self.dec_qo) + self.dec_launch
            else:
                attn_decode = 0.0
            if self.engine:
                attn_decode = self._in_engine("attn_decode", attn_decode, eager)
            parts = (linear, lm_head, attn_prefill, attn_decode, prefix, merge, kv_write, kv_copy, overhead)
            total = linear + lm_head + attn_prefill + attn_decode + prefix + merge + kv_write + kv_copy + overhead
            return StepResult(total, dict(zip(BREAKDOWN_KEYS, parts)))
        # decode fast-forward: step s has every context grown by s
        toks = tok + np.arange(n, dtype=np.int64) * n_dec
        if n_dec and self.form == 2:
            dec = dec2
        elif n_dec:
            dec = np.maximum(toks * self.dec_f_tok,
                             (toks * inv_priv + shared_eff) * self.dec_b_tok + n_dec * self.dec_qo) + self.dec_launch
        else:
            dec = np.zeros(n)
        if self.engine:
            dec = self._in_engine("attn_decode", dec)
        copy = np.zeros(n)
        copy[0] = kv_copy
        steps = linear + lm_head + attn_prefill + dec + prefix + merge + kv_write + copy + overhead
        durations = steps.tolist()
        total = 0.0
        for x in durations:
            total += x
        breakdown = dict(zip(BREAKDOWN_KEYS, (linear * n, lm_head * n, attn_prefill * n, float(dec.sum()),
                                              prefix * n, merge * n, kv_write * n, kv_copy, overhead * n)))
        return StepResult(total, breakdown, step_durations=tuple(durations))


_TABLES: dict[tuple, CostTables] = {}


def cost_tables(profile: HardwareProfile, model: ModelShape) -> CostTables:
    """The cached constants of (profile, model) (built once per profile object and model)."""
    key = (profile, model)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = CostTables(profile, model)
    return t


# ---- public functions --------------------------------------------------------------------------
def step_cost(plan: BatchPlan, profile: HardwareProfile, model: ModelShape) -> StepResult:
    """Predicted duration and breakdown (keys :data:`BREAKDOWN_KEYS`) of ``plan`` (all its steps)."""
    key = (profile, model)
    t = _TABLES.get(key)
    if t is None:
        t = cost_tables(profile, model)
    return t.step(plan)


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

