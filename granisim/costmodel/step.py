"""A batch plan's step: its requests and groups priced part by part, as the engine launches them
(a mixin of CostTables)."""

from __future__ import annotations

import math
from itertools import compress
from operator import itemgetter, not_

import numpy as np

from granisim.config.coefficients import LINEAR_KNOTS
from granisim.core.contract import BatchPlan, StepResult, step_result
from granisim.core.planned import columns

from .correction import multi_prefill_factor, storage_class
from .operators import BREAKDOWN_KEYS


def _ungrouped_rows(cols):
    """(T, decode rows, their tokens read, their longest context, prefill row indices) of ungrouped
    rows, as sums over the columns; None when a non-prefill row computes other than one token."""
    pre, nn = cols.is_prefill, cols.num_new
    nd = getattr(cols, "n_decode", None)
    if nd is not None:  # decode rows first, one token each; then the prefill rows (the same sums)
        n = len(nn)
        sums = cols.decode_sums if nd else (0, -1)  # (sum, max) of the decode rows' contexts, if known
        if sums is None:
            dec = cols.context_len[:nd]
            sums = sum(dec), max(dec)
        if nd == n:
            return n, n, sums[0] + n, sums[1] + 1, []
        return nd + sum(nn[nd:]), nd, sums[0] + nd, sums[1] + 1, list(range(nd, n))
    ctx = cols.context_len
    pidx = list(compress(range(len(pre)), pre)) if True in pre else []
    n_dec = len(nn) - len(pidx)
    if nn.count(1) - sum(1 for i in pidx if nn[i] == 1) != n_dec:
        return None
    if not pidx:
        return len(nn), n_dec, sum(ctx) + n_dec, max(ctx) + 1, pidx
    dec = list(compress(ctx, map(not_, pre)))
    return sum(nn), n_dec, sum(dec) + n_dec, max(dec) + 1 if dec else 0, pidx


def _grouped_rows(cols, groups):
    """(T, decode rows, tokens read by decode rows outside prefix passes, their longest context, prefix-pass
    members, their suffix tokens, their longest suffix, prefill row indices): the row loop's integer sums
    for columns whose decode rows come first (``n_decode``) when no group is ``paged``, taken a group at a
    time from its members; None otherwise (the row loop prices it). Every group's members are decode rows
    when it answers, so the prefill rows are in no group."""
    nd = getattr(cols, "n_decode", None)
    if nd is None or any(g.path == "paged" for g in groups):
        return None
    kept = _kept_group_sums(cols, groups, nd)
    if kept is not None:
        return kept
    ctx, shared, nn = cols.context_len, cols.shared_len, cols.num_new
    n = len(nn)
    merge_rows = tok_s = lmax_s = member_ctx = 0
    for g in groups:
        idx = g.members
        if len(idx) < 2 or max(idx) >= nd:
            return None
        gctx = itemgetter(*idx)(ctx)
        c = [a - b for a, b in zip(gctx, itemgetter(*idx)(shared))]  # each member's suffix tokens, less one
        merge_rows += len(idx)
        member_ctx += sum(gctx)
        tok_s += sum(c) + len(idx)
        m = max(c) + 1
        if m > lmax_s:
            lmax_s = m
    dec = ctx[:nd]
    tok = sum(dec) - member_ctx + (nd - merge_rows) + tok_s  # whole contexts outside the groups, suffixes in them
    lmax = 0
    if merge_rows != nd:  # decode rows outside every group read their whole context
        lone = [c for c, g in zip(dec, cols.group) if g < 0]
        lmax = max(lone) + 1
    return nd + sum(nn[nd:]), nd, tok, lmax, merge_rows, tok_s, lmax_s, list(range(nd, n))


def _kept_group_sums(cols, groups, nd: int):
    """``_grouped_rows`` from the sums the scheduler's decode batch kept (``PlannedRequests.decode_groups``:
    per group node id, its decode rows, their context sum and longest context; the plan's groups are its
    groups of two rows or more, its members decode rows: every other decode row reads its whole context, and
    no prefill row is in a group); None without them."""
    kept = cols.decode_groups
    if kept is None:
        return None
    merge_rows = tok_s = lmax_s = member_ctx = 0
    for g in groups:
        rows, ctx_sum, ctx_max = kept.get(g.key, (0, 0, 0))
        if rows != len(g.members) or rows < 2:  # not the batch's group: price row by row
            return None
        merge_rows += rows
        member_ctx += ctx_sum
        tok_s += ctx_sum - rows * g.prefix_len + rows  # each member's suffix tokens, plus one
        lmax_s = max(lmax_s, ctx_max - g.prefix_len + 1)
    tok = cols.decode_sums[0] - member_ctx + (nd - merge_rows) + tok_s
    lmax = 0
    if merge_rows != nd:  # the rows outside every group: their longest whole context
        in_groups = {g.key for g in groups}
        lmax = max(v[2] for k, v in kept.items() if k not in in_groups) + 1
    nn = cols.num_new
    return nd + sum(nn[nd:]), nd, tok, lmax, merge_rows, tok_s, lmax_s, list(range(nd, len(nn)))


def self_share(num_new, context_len, rows) -> float:
    """The share of the prefill attention FLOPs of ``rows`` (indices into the columns) over the requests' own new
    tokens (causal: q (q + 1) / 2 each) rather than their cached context (q c) (pure)."""
    own = ctx = 0.0
    for i in rows:
        q = float(num_new[i])
        own += q * (q + 1.0) / 2.0
        ctx += q * float(context_len[i])
    return own / (own + ctx) if own + ctx > 0 else 1.0


class StepPricing:
    """CostTables.step (needs the table's part times: linear, prefill, prefix pass, decode, merge, ...)."""

    def _in_engine(self, key: str, t, eager: bool = False, launches: int = 1, offset: float | None = None):
        """Model time -> the real engine's time for one breakdown key (graph-replayed or eager step): scale
        times the model's, plus the offset once per launch of the key (attn_decode: the whole-context and
        the suffix decode are two launches; attn_prefix: one launch per prefix pass; the others one);
        ``offset`` replaces the key's offset (the linear part's offset by step size)."""
        a, b = (self.engine_eager if eager else self.engine)[key]
        b = b if offset is None else offset
        floor = self.eager_floor.get(key, 0.0) if eager else 0.0  # host-bound eager launches
        if isinstance(t, np.ndarray):
            return np.where(t > 0, np.maximum(a * t + b * launches, floor), 0.0)
        return max(a * t + b * launches, floor) if t > 0 else 0.0

    def _linear_offset(self, tokens: int) -> float | None:
        """A graph-replayed step's linear offset at its size (log-linear between the profile's knots, flat
        beyond them); None without knots (engine.linear.offset_s stands)."""
        if self.linear_knots is None:
            return None
        n = min(max(tokens, 1), LINEAR_KNOTS[-1])  # flat beyond the last knot: at most 2048 memo entries
        v = self._memo_lin_off.get(n)  # the step loop prices the same few sizes over and over
        if v is None:
            v = self._memo_lin_off[n] = float(np.interp(math.log2(n), *self.linear_knots))
        return v

    def _host(self, requests: int, kv_tokens, passes: int):
        """Host overhead of a step (``kv_tokens`` may be an array: one value per fast-forwarded step)."""
        return (self.step_overhead + self.overhead_req * requests + self.overhead_tok * kv_tokens
                + self.overhead_pass * passes)

    def step(self, plan: BatchPlan) -> StepResult:
        return self.step_block(plan)[0]

    def step_block(self, plan: BatchPlan) -> tuple[StepResult, StepBlock | None]:
        """``step(plan)``, and for a fast-forwarded plan (``num_steps`` > 1) its per-step parts, from
        which :meth:`StepBlock.first` gives the result of the plan's first steps without pricing again."""
        if not plan.groups and self.form != 2 and not self.engine:
            cols = columns(plan.requests)
            fast = _ungrouped_rows(cols) if cols.rid else None
            if fast is not None:
                return self._ungrouped_step(plan, cols, fast)
        page_size = plan.page_size
        if self.corr:
            self._priv_class = storage_class(None, page_size)
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
        shared_len = 0  # prefix tokens of paged-group members: in their lengths, streamed at shared_eff
        fresh = [True] * len(gpaged)  # a paged group's first member streams its prefix; the rest re-read it
        cols = columns(plan.requests)
        n_req = len(cols.rid)  # (len(cols) without its Python __len__)
        fast = _ungrouped_rows(cols) if n_req and not plan.groups else None
        sums = _grouped_rows(cols, plan.groups) if n_req and plan.groups else None
        if fast is not None:  # no groups: every decode row reads its whole context (the loop below, as sums)
            T, n_dec, tok, lmax, pidx = fast
        elif sums is not None:  # prefix passes only: the loop below, as sums a group at a time
            T, n_dec, tok, lmax, merge_rows, tok_s, lmax_s, pidx = sums
        else:
            pidx = []
            for i, (ctx, nn, pre, g, s) in enumerate(zip(cols.context_len, cols.num_new, cols.is_prefill, cols.group,
                                                         cols.shared_len)):
                T += nn
                if nn == 1 and not pre:
                    n_dec += 1
                    if g >= 0:
                        c = ctx + 1 - s
                        tok += c
                        if gpaged[g]:
                            f = 1.0 if fresh[g] else self.reread
                            fresh[g] = False
                            shared_eff += s * ginv[g] * f
                            shared_raw += s * f
                            shared_len += s
                            c += s
                        else:
                            merge_rows += 1
                            tok_s += c
                            if c > lmax_s:
                                lmax_s = c
                            continue
                    else:
                        c = ctx + 1
                        tok += c
                    if c > lmax:
                        lmax = c
                else:
                    pidx.append(i)
        n = plan.num_steps
        if n > 1 and pidx:
            raise ValueError(f"num_steps={n} needs a decode-only plan (step {plan.step} has prefill work)")
        eager = bool(self.graph_max) and T > self.graph_max
        # prefill rows outside every group (no groups, or the grouped sums say so), priced from the columns on
        # form 1 unless the eager multi-prefill factor reads them as requests
        from_cols = (pidx and (sums is not None or fast is not None) and self.form != 2
                     and not (eager and self.pf_multi[0]))
        prefill_reqs = [plan.requests[i] for i in pidx] if pidx and not from_cols else None
        linear = self.linear_time(T)
        lm_head = self.lm_head_time(n_req)
        if from_cols:
            attn_prefill = self._ungrouped_prefill(cols, pidx, inv_priv)
        elif prefill_reqs and self.form == 2:
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
        # the host lists every KV slot a decode row reads: paged-group members' prefix pages too (host_work)
        host_tok = tok + shared_len
        overhead = self._host(n_req, host_tok, len(passes))
        if eager and prefill_reqs and self.pf_multi[0]:  # several requests' prefill attention inside the step
            attn_prefill *= multi_prefill_factor(prefill_reqs, *self.pf_multi)
        if self.engine:
            linear = self._in_engine("linear", linear, eager, offset=None if eager else self._linear_offset(T))
            lm_head, attn_prefill, merge, kv_write = (
                self._in_engine(k, v, eager) for k, v in (("lm_head", lm_head), ("attn_prefill", attn_prefill),
                                                          ("merge", merge), ("kv_write", kv_write)))
            prefix = self._in_engine("attn_prefix", prefix, eager, len(passes))
            if self.attn_in_step and pidx:  # between the step's GEMMs (coefficients.py: engine.attn_in_step.*)
                own, context, per_ktok = self.attn_in_step
                context += per_ktok * T / 1000.0
                w = self_share(cols.num_new, cols.context_len, pidx)
                attn_prefill, prefix = attn_prefill * (w * own + (1.0 - w) * context), prefix * context
        if n <= 1 and self.form != 2:  # one step: the form-1 decode below, on one value (the same operations)
            attn_decode = 0.0
            if n_dec:
                toks = float(tok)
                attn_decode = max(toks * self.dec_f_tok, (toks * inv_priv + shared_eff) * self.dec_b_tok
                                  + n_dec * self.dec_qo) + self.dec_launch
                if self.engine:
                    attn_decode = self._in_engine("attn_decode", attn_decode, eager,
                                                  (n_dec > merge_rows) + (merge_rows > 0))
                attn_decode = float(attn_decode)
            parts = (linear, lm_head, attn_prefill, attn_decode, prefix, merge, kv_write, kv_copy, overhead)
            total = linear + lm_head + attn_prefill + attn_decode + prefix + merge + kv_write + kv_copy + overhead
            return step_result(total, dict(zip(BREAKDOWN_KEYS, parts))), None
        if n <= SHORT_BLOCK and self.form != 2 and not self.engine:  # the block below, on floats
            return self._short_block(n, n_req, n_dec, tok, host_tok, inv_priv, shared_eff, len(passes),
                                     (linear, lm_head, attn_prefill, prefix, merge, kv_write), kv_copy)
        # attn_decode of each step (step s: every context grown by s)
        steps_ = np.arange(max(n, 1), dtype=float)
        if not n_dec:
            dec = np.zeros(steps_.size)
        elif self.form == 2:
            # as the engine launches them: one decode over whole contexts, one over pass members' suffixes
            # (both priced in one vectorised call: rows of the arrays are the launches)
            rows, t0, lm, s_eff, s_raw, s_len = (np.array(c, float)[:, None] for c in zip(*(
                launch for launch in ((n_dec - merge_rows, tok - tok_s, lmax, shared_eff, shared_raw, shared_len),
                                      (merge_rows, tok_s, lmax_s, 0.0, 0.0, 0)) if launch[0])))
            toks2 = t0 + steps_ * rows
            qo = rows * 2.0 * self.n_q * self.d * self.b
            dec = self.decode_time2(toks2, rows, lm + steps_, (toks2 * inv_priv + s_eff) * self.kvb + qo,
                                    raw_bytes=(toks2 + s_raw) * self.kvb + qo, kv_lens=toks2 + s_len).sum(axis=0)
        else:
            toks = tok + steps_ * n_dec
            dec = np.maximum(toks * self.dec_f_tok,
                             (toks * inv_priv + shared_eff) * self.dec_b_tok + n_dec * self.dec_qo) + self.dec_launch
        if self.engine:
            dec = self._in_engine("attn_decode", dec, eager, (n_dec > merge_rows) + (merge_rows > 0))
        if n <= 1:
            attn_decode = float(dec[0])
            parts = (linear, lm_head, attn_prefill, attn_decode, prefix, merge, kv_write, kv_copy, overhead)
            total = linear + lm_head + attn_prefill + attn_decode + prefix + merge + kv_write + kv_copy + overhead
            return step_result(total, dict(zip(BREAKDOWN_KEYS, parts))), None
        # decode fast-forward
        host = self._host(n_req, host_tok + n_dec * np.arange(n), len(passes))  # a token a step more
        steps = linear + lm_head + attn_prefill + dec + prefix + merge + kv_write
        steps[0] += kv_copy  # the copies run before the first step (adding 0.0 to the others changes nothing)
        steps += host
        block = StepBlock(steps, dec, host, (linear, lm_head, attn_prefill, prefix, merge, kv_write), kv_copy)
        return block.first(n), block

    def _ungrouped_step(self, plan: BatchPlan, cols, fast: tuple) -> tuple[StepResult, StepBlock | None]:
        """``step_block`` of a plan without groups, on form 1 without engine scaling, whose rows
        ``_ungrouped_rows`` sums (``fast``): the same operations on the same values, without the parts
        that are zero or unused then (prefix passes, merges, paged-group re-reads). Most plans of a
        workload without shared prefixes."""
        page_size = plan.page_size
        if self.corr:
            self._priv_class = storage_class(None, page_size)
        inv_priv = self._inv_eff(None, page_size)
        T, n_dec, tok, lmax, pidx = fast
        n_req = len(cols.rid)  # (len(cols) without its Python __len__)
        n = plan.num_steps
        if pidx:
            if n > 1:
                raise ValueError(f"num_steps={n} needs a decode-only plan (step {plan.step} has prefill work)")
            if self.graph_max and T > self.graph_max and self.pf_multi[0]:  # eager, several prefills in the step
                prefill_reqs = [plan.requests[i] for i in pidx]
                attn_prefill = self.prefill_time(prefill_reqs, inv_priv, [])
                attn_prefill *= multi_prefill_factor(prefill_reqs, *self.pf_multi)
            else:
                attn_prefill = self._ungrouped_prefill(cols, pidx, inv_priv)
        else:
            attn_prefill = 0.0
        linear = self.linear_time(T)
        lm_head = self.lm_head_time(n_req)
        kv_write = T * self.kvw_tok + self.kvw_launch if T else 0.0
        if plan.copies:
            kv_copy = sum(c.length for c in plan.copies) * self.copy_tok + self.copy_launch
        else:
            kv_copy = 0.0
        prefix = merge = 0.0
        if n > 1:
            if n <= SHORT_BLOCK:
                return self._short_block(n, n_req, n_dec, tok, tok, inv_priv, 0.0, 0,
                                         (linear, lm_head, attn_prefill, prefix, merge, kv_write), kv_copy)
            return self._long_block(plan, n, n_req, n_dec, tok, inv_priv, linear, lm_head, attn_prefill, kv_write,
                                    kv_copy)
        overhead = self._host(n_req, tok, 0)
        attn_decode = 0.0
        if n_dec:
            toks = float(tok)
            attn_decode = float(max(toks * self.dec_f_tok, (toks * inv_priv + 0.0) * self.dec_b_tok
                                    + n_dec * self.dec_qo) + self.dec_launch)
        total = linear + lm_head + attn_prefill + attn_decode + prefix + merge + kv_write + kv_copy + overhead
        return step_result(total, dict(zip(BREAKDOWN_KEYS, (linear, lm_head, attn_prefill, attn_decode, prefix,
                                                            merge, kv_write, kv_copy, overhead)))), None

    def _ungrouped_prefill(self, cols, pidx: list, inv_priv: float) -> float:
        """``prefill_time`` (form 1) of the rows ``pidx``, none of them in a group, read from the columns (no
        PlannedRequest per row) and with only the terms form 1 sums: the same operations in the same order."""
        f = bts = 0.0
        num_new, context = cols.num_new, cols.row_context
        G, mt, d, n_q, kvb, b = self.G, self.pf_mt, self.d, self.n_q, self.kvb, self.b
        ceil = math.ceil
        for i in pidx:
            q = num_new[i]
            if q <= 0:
                continue
            c = context(i)
            kv_eff = (c - 0) * inv_priv + 0 * 0.0  # no group: no shared part (prefill_time's s = 0, inv_s = 0.0)
            rows = q * G  # _prefill_terms' FLOPs and bytes
            nt = ceil(rows / mt)
            pad = nt * mt / rows
            f += 4.0 * d * n_q * (q * c + q * (q + 1) / 2.0) * pad
            bts += kvb * (kv_eff + q) + 2.0 * q * n_q * d * b
        return max(f * self.pf_a, bts * self.pf_b) + self.pf_launch

    def _long_block(self, plan, n, n_req, n_dec, tok, inv_priv, linear, lm_head, attn_prefill, kv_write, kv_copy):
        """``step_block``'s array form of a block over SHORT_BLOCK steps, for ``_ungrouped_step``."""
        steps_ = np.arange(n, dtype=float)
        if not n_dec:
            dec = np.zeros(steps_.size)
        else:
            toks = tok + steps_ * n_dec
            dec = np.maximum(toks * self.dec_f_tok,
                             (toks * inv_priv + 0.0) * self.dec_b_tok + n_dec * self.dec_qo) + self.dec_launch
        prefix = merge = 0.0
        host = self._host(n_req, tok + n_dec * np.arange(n), 0)
        steps = linear + lm_head + attn_prefill + dec + prefix + merge + kv_write
        steps[0] += kv_copy
        steps += host
        block = StepBlock(steps, dec, host, (linear, lm_head, attn_prefill, prefix, merge, kv_write), kv_copy)
        return block.first(n), block

    def _short_block(self, n: int, n_req: int, n_dec: int, tok: int, host_tok: int, inv_priv: float,
                     shared_eff: float, passes: int, fixed: tuple, kv_copy: float) -> tuple[StepResult, StepBlock]:
        """The form-1 fast-forward block of ``step_block`` without engine scaling, step by step on
        Python floats: the same IEEE operations in the same order as its array expressions (an
        integer operand is converted to float as numpy converts it), so the same values, without
        the fixed cost of a dozen array operations on a few steps (a block has 5-6 steps on average)."""
        linear, lm_head, attn_prefill, prefix, merge, kv_write = fixed
        base = linear + lm_head + attn_prefill
        host0 = self.step_overhead + self.overhead_req * n_req
        per_tok, per_pass = self.overhead_tok, self.overhead_pass * passes
        f_tok, b_tok, qo, launch = self.dec_f_tok, self.dec_b_tok, n_dec * self.dec_qo, self.dec_launch
        dec, host, steps = [], [], []
        total = 0.0  # the steps summed left to right, as first() sums them
        for s in range(n):  # one pass: each step's decode, host and whole time
            d = 0.0
            if n_dec:  # max(a, b) as ``b if b > a else a`` (what max returns), without the call
                toks = tok + float(s) * n_dec
                a = toks * f_tok
                b = (toks * inv_priv + shared_eff) * b_tok + qo
                d = (b if b > a else a) + launch
            h = host0 + per_tok * (host_tok + n_dec * s) + per_pass
            # the first step's copies (adding 0.0 to the others changes nothing)
            t = base + d + prefix + merge + kv_write + (0.0 if s else kv_copy) + h
            dec.append(d)
            host.append(h)
            steps.append(t)
            total += t
        block = StepBlock(steps, dec, host, fixed, kv_copy)  # lists: first() sums them as numpy would
        return block.result(n, total, numpy_sum(dec), numpy_sum(host), steps), block


# fast-forward blocks of at most this many steps are priced on floats (StepPricing._short_block)
SHORT_BLOCK = 64


class StepBlock:
    """A fast-forwarded plan's per-step parts: step ``s``'s duration, attention decode and host time do
    not depend on how many steps the plan stands for (each is computed from ``s`` alone), so the result of
    its first ``k`` steps is the result of pricing the plan with ``num_steps = k`` (k >= 2). The parts are
    arrays, or lists of floats for a short block (``StepPricing._short_block``): the same values."""

    __slots__ = ("steps", "dec", "host", "fixed", "kv_copy")

    def __init__(self, steps, dec, host, fixed: tuple, kv_copy: float):
        self.steps, self.dec, self.host = steps, dec, host
        self.fixed = fixed  # (linear, lm_head, attn_prefill, prefix, merge, kv_write): the same every step
        self.kv_copy = kv_copy  # the first step's only

    def __len__(self) -> int:
        return len(self.steps)

    def first(self, k: int) -> StepResult:
        n = len(self.steps)
        if not 2 <= k <= n:
            raise ValueError(f"a block of {n} steps has no result for its first {k} (2 or more)")
        whole = k == n
        dec, host = (self.dec, self.host) if whole else (self.dec[:k], self.host[:k])
        if isinstance(self.steps, list):
            durations = self.steps if whole else self.steps[:k]
            dec_s, host_s = numpy_sum(dec), numpy_sum(host)
        else:
            durations = (self.steps if whole else self.steps[:k]).tolist()
            add = np.add.reduce  # ndarray.sum without its Python wrapper
            dec_s, host_s = float(add(dec)), float(add(host))
        total = 0.0
        for x in durations:  # left to right, as the engine's clock adds them (sum() compensates on 3.12+)
            total += x
        return self.result(k, total, dec_s, host_s, durations)

    def result(self, k: int, total: float, dec_s: float, host_s: float, durations) -> StepResult:
        """The result of the first ``k`` steps from their durations (``total``: summed left to right) and
        their decode and host times summed as numpy sums them (``first``)."""
        linear, lm_head, attn_prefill, prefix, merge, kv_write = self.fixed
        breakdown = dict(zip(BREAKDOWN_KEYS, (linear * k, lm_head * k, attn_prefill * k, dec_s,
                                              prefix * k, merge * k, kv_write * k, self.kv_copy, host_s)))
        return step_result(total, breakdown, None, tuple(durations))


def numpy_sum(xs: list) -> float:
    """``float(np.add.reduce(np.array(xs)))`` for a list of floats, bit for bit, without the array: numpy's
    pairwise summation (from 0.0, left to right below 8 values; eight accumulators over blocks of up to
    128; halves, cut at a multiple of 8, above)."""
    n = len(xs)
    if n < 8:
        res = 0.0
        for x in xs:
            res += x
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = xs[:8]
        m = n - n % 8
        for i in range(8, m, 8):
            r0 += xs[i]
            r1 += xs[i + 1]
            r2 += xs[i + 2]
            r3 += xs[i + 3]
            r4 += xs[i + 4]
            r5 += xs[i + 5]
            r6 += xs[i + 6]
            r7 += xs[i + 7]
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for x in xs[m:]:
            res += x
        return res
    half = n // 2
    half -= half % 8
    return numpy_sum(xs[:half]) + numpy_sum(xs[half:])
