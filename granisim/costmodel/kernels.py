"""Form 2 of the attention and KV kernels: the Triton launchers' own split and tile rules and a wave
model of their programs (a mixin of CostTables; every coefficient from the profile)."""

from __future__ import annotations

import math

import numpy as np

from granisim.config.models import ModelShape

from . import split_rule
from .correction import Correction, page_eff
from .operators import _MEMO_MAX


class KernelForms:
    """Form-2 kernel times of CostTables (needs its constants: layers, n_q, n_kv, d, b, P, BW, sms, corr)."""

    def _init_form2(self):
        p = self.profile
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
        self.balance_skew = p["attn.cascade.balance_skew"]
        self.skew_stream = p["attn.decode.skew_stream"]
        self.dense_max_splits = int(p["attn.dense.max_splits"])
        self.merge_eff_bw = self.BW * p["attn.merge.mem_eff"]
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
        return 1.0 if storage == "slab" else 1.0 / page_eff(storage, page_size, self.pf_page1, self.pf_page16)

    @staticmethod
    def _block_n(m_tile):
        """KV tile of the launchers: 64 tokens for row tiles up to 64, else 128."""
        return np.where(np.asarray(m_tile) <= 64, 64.0, 128.0)

    def _row_tile(self, path, m):
        """Row tile of a prefix pass over M_eff = m rows: cascade the next power of two within its
        [min_m_tile, m_tile], dense its fixed tile (arrays broadcast)."""
        p = self.profile
        if path == "cascade":
            return np.clip(2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))), p["attn.cascade.min_m_tile"],
                           p["attn.cascade.m_tile"])
        return np.full_like(np.asarray(m, float), p["attn.dense.m_tile"])

    def split_rule(self, base, kv_len, block_n, gather=False, mean_len=None, cap=None):
        """(n_splits, chunk) of the split-KV launchers (:func:`granisim.costmodel.split_rule.kv_splits`, the
        rule gpu_backend.kernels.split_kv calls): about ``ctas_per_sm`` programs per SM rounded down (slabs,
        128-row tiles), or ``gather_ctas_per_sm`` rounded up (gathered storage with row tiles <= 64:
        ``gather`` True); given the batch's ``mean_len``, a skewed batch is cut into splits of at most
        ``max(balance_chunk, mean_len)``; ``cap`` instead sets that longest split (a launch run at a fixed cap).
        Arrays broadcast."""
        if cap is None:
            cap = 0.0
            if self.balance_chunk and mean_len is not None:
                cap = split_rule.balance_cap(kv_len, mean_len, balance_chunk=self.balance_chunk,
                                             balance_skew=self.balance_skew)
        target = np.where(gather, self.gather_ctas_per_sm * self.sms, self.ctas_per_sm * self.sms)
        return split_rule.kv_splits(base, kv_len, block_n, target=target, round_up=gather, min_chunk=self.min_split,
                                    max_splits=self.max_splits, max_chunk=cap)

    def _skewed(self, longest, mean_len):
        return split_rule.skewed(longest, mean_len, balance_skew=self.balance_skew)

    def dense_split_rule(self, base, kv_len, block_n=128.0):
        """(n_splits, chunk) of the dense prefix pass (:func:`granisim.costmodel.split_rule.dense_splits`, the
        rule gpu_backend.kernels.dense calls), with the profile's ``attn.dense.max_splits``."""
        base = np.asarray(base, float)
        L = float(kv_len)
        if L <= 0 or self.dense_max_splits <= 1:
            return np.ones_like(base), np.full_like(base, max(L, block_n))
        n, chunk = split_rule.dense_splits(base, L, block_n, sms=self.sms, max_splits=self.dense_max_splits)
        return n + 0.0 * base, chunk + 0.0 * base

    @staticmethod
    def _as_run(n, chunk, splits, kv_len, block_n):
        """(n_splits, chunk) of launches that were measured: ``splits`` = (recorded n_splits, recorded chunk
        or None) where a row has them (finite, > 0; the chunk, if not recorded, in whole ``block_n`` tiles as
        the launchers cut it), else the rule's ``n``, ``chunk``. A calibration row is priced with the split
        count its launch ran, whatever today's rule would pick; the simulator's own launches have none (their
        callers skip this)."""
        rn, rc = splits
        rn = np.asarray(rn, float)
        have = np.isfinite(rn) & (rn > 0)
        safe = np.where(have, rn, 1.0)
        c = split_rule.whole_tiles(np.asarray(kv_len, float), safe, block_n)
        if rc is not None:
            rc = np.asarray(rc, float)
            c = np.where(np.isfinite(rc) & (rc > 0), rc, c)
        return np.where(have, rn, n), np.where(have, c, chunk)

    def kernel_time2(self, fam, programs, flops_prog, bytes_prog, launches=1.0, partial_bytes=0.0, inv_eff=1.0,
                     first_bytes=0.0, longest_bytes=None, stream=1.0):
        """Seconds (one layer) of one kernel of family ``fam`` (wave model; arrays broadcast).

        ``programs`` programs, each doing ``flops_prog`` / ``bytes_prog``. An SM runs
        ``resident_ctas_per_sm`` programs at once: ``waves = ceil(programs / (sm_count * resident))``.
        ``n`` programs running together share the GPU: one computes at ``bf16_flops * flop_eff /
        max(sm_count, n)`` and streams at ``hbm_bandwidth * mem_eff / max(sm_count * sat_ctas_per_sm / e, n)``
        where ``e = 1 / inv_eff`` is the storage's gather efficiency: a gather slows one program's stream
        (dependent index loads: latency), not the GPU's bandwidth once enough programs share it; a
        program's first KV tile (``first_bytes``) arrives while its prologue runs; no wave ends before its
        longest program (``longest_bytes``, default ``bytes_prog``) has streamed at that one-program rate;
        ``stream`` times the shared stream's time (programs of very mixed lengths share the bandwidth less well).
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
        one = bytes_prog if longest_bytes is None else np.maximum(bytes_prog, longest_bytes)
        shared = bytes_prog * conc * stream
        mem = np.maximum((one - first_bytes) * self.sms * sat * inv_eff, shared) / (self.BW * em)
        # the per-program fixed work is issue-bound: one SM retires programs' prologues one after another
        over = prog * np.maximum(1.0, N / self.sms)
        return launches * launch + over + waves * np.maximum(comp, mem) + partial_bytes / self.merge_eff_bw

    def decode_time2(self, tok, n_dec, max_len, nbytes, gather=True, raw_bytes=None, kv_lens=None, splits=None):
        """Seconds (all layers) of the decode kernel over ``n_dec`` requests reading ``tok`` KV tokens
        (``nbytes`` bytes per layer, gathers included), longest ``max_len`` tokens; ``gather``: the KV is
        in page tables / slot lists (the simulator's private storage), not slabs; ``kv_lens``: the sum of
        the sequences' lengths where it differs from ``tok`` (paged-group members re-reading a shared
        prefix from L2 stream less than their length); ``splits``: the (n_splits, chunk) a measured launch
        ran (:meth:`_as_run`; calibration rows), else the rule's; arrays broadcast."""
        base = self.n_kv * np.asarray(n_dec, float)  # one row tile (G query heads) per request and KV head
        tok = np.asarray(tok, float)
        lens = tok if kv_lens is None else np.asarray(kv_lens, float)
        mean = lens / np.maximum(n_dec, 1)
        n, chunk = self.split_rule(base, max_len, 64.0, gather=np.logical_and(gather, self.dec_tile <= 64),
                                   mean_len=mean)
        if splits is not None:
            n, chunk = self._as_run(n, chunk, splits, max_len, 64.0)
        N = base * n
        # a batch balanced over skewed lengths leaves most of its short sequences' splits empty (those
        # programs exit at once): about lens / chunk + n_dec / 2 splits hold KV
        skewed = (n > 1) & self._skewed(max_len, mean)
        N = np.where(skewed, np.clip(self.n_kv * (lens / chunk + 0.5 * np.asarray(n_dec, float)), base, N), N)
        per = lens * self.n_kv / N                     # mean KV tokens of one program
        pad = np.ceil(per / 64.0) * 64.0 / np.maximum(per, 1e-9)  # a program streams whole 64-token tiles
        flops = 4.0 * self.dec_tile * self.d * per * pad
        split = n > 1
        partial = np.where(split, 2.0 * n * n_dec * self.n_q * (self.d + 1) * 4.0, 0.0)
        raw = nbytes if raw_bytes is None else raw_bytes
        # a ragged batch's longest sequence (its longest split) streams alone at one program's rate
        longest = np.where(split, np.minimum(chunk, max_len), max_len)
        longest_bytes = raw / N / np.maximum(per, 1e-9) * np.ceil(longest / 64.0) * 64.0
        t = self.kernel_time2("decode", N, flops, raw / N * pad, np.where(split, 2.0, 1.0), partial,
                              inv_eff=nbytes / np.maximum(raw, 1e-30), first_bytes=64.0 * 2.0 * self.d * self.b,
                              longest_bytes=longest_bytes,
                              stream=np.where(skewed, self.skew_stream, 1.0) if self.skew_stream != 1.0 else 1.0)
        if self.corr:
            t = t * self._corr("decode", "slab" if not np.any(gather) else self._priv_class,
                               np.log2(np.maximum(n_dec, 1)), np.log2(np.maximum(tok / np.maximum(n_dec, 1), 1.0)))
        return self.layers * t

    def prefix_time2(self, path, L, m, inv_eff, gather=False, cls=None, splits=None):
        """Form 2 of :meth:`prefix_time_array` (m: numpy array of M_eff; ``cls``: kernel-table storage
        class for the measured correction, None = none; ``splits``: the (n_splits, chunk) measured launches
        ran, :meth:`_as_run`)."""
        bm = self._row_tile(path, m)
        bn = self._block_n(bm)
        tiles = np.maximum(1.0, np.ceil(m / bm))
        base = tiles * self.n_kv
        if path == "cascade":
            n, chunk = self.split_rule(base, L, bn, gather=np.logical_and(gather, bm <= 64))
        else:
            n, chunk = self.dense_split_rule(base, L, float(bn.flat[0]) if bn.size else 128.0)
        if splits is not None:
            n, chunk = self._as_run(n, chunk, splits, L, bn)
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
        Ls, ms = np.asarray(Ls, float), np.asarray(ms, float)
        bm = float(self._row_tile(path, ms.max()))
        bn = float(self._block_n(bm))
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
        """Correction functions (measured / formula) per (family, storage class) from a kernel table; the
        formula of a row with a recorded ``n_splits`` prices the split count its launch ran."""
        from dataclasses import replace

        rows = table.rows
        ref = ModelShape("table", 1, int(table.model["hidden"]), int(table.model["n_kv_heads"]) * 4,
                         int(table.model["n_kv_heads"]), int(table.model["head_dim"]),
                         int(table.model["intermediate"]), int(table.model["vocab"]))
        pts: dict = {}
        tabs: dict = {}
        n = len(rows["family"])
        recorded = rows.get("n_splits")  # the split count each measured launch ran (0: not recorded)
        for i in range(n):
            fam, st = rows["family"][i], rows["storage"][i]
            G = int(rows["G"][i]) or 4
            t = tabs.get(G)
            if t is None:
                t = tabs[G] = type(self)(self.profile, replace(ref, n_q_heads=ref.n_kv_heads * G), use_table=False)
            B, Lk, T = rows["B"][i], rows["L"][i], rows["T"][i]
            ran = (float(recorded[i]), None) if recorded is not None else None  # the row's own splits
            cls = st if st in ("slab", "slots", "pages16") else "slots"
            sto, ps = {"slab": ("slab", 1), "slots": ("paged", 1), "pages16": ("paged", 16)}[cls]
            if fam == "decode":
                inv = 1.0 / t.storage_eff(sto, ps)
                tok = B * Lk
                qo = B * 2.0 * t.n_q * t.d * t.b
                f = t.decode_time2(tok, B, Lk, tok * t.kvb * inv + qo, gather=cls != "slab",
                                   raw_bytes=tok * t.kvb + qo, splits=ran)
                key, x, y = ("decode", cls), np.log2(B), np.log2(max(Lk, 1.0))
            elif fam in ("cascade", "dense"):
                f = t.prefix_time2(fam, Lk, np.array([rows["M_eff"][i]]), 1.0 / t.storage_eff(sto, ps),
                                   gather=cls != "slab", splits=ran)[0]
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
            point = (x, y, np.log(rows["median_us"][i] * 1e-6 / float(f)))
            pts.setdefault(key, []).append(point)
            if fam == "extend" and Lk == 0:  # no cached context: storage does not matter, every class starts here
                for other in {"slots", "pages16"} - {cls}:
                    pts.setdefault(("prefill", other), []).append(point)
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

    def _streaming_time2(self, fam: str, units: int, block: float, unit_bytes: float, correct: bool) -> float:
        """Seconds (all layers) of a memory-bound kernel of ``units`` rows, ``block`` rows per program."""
        key = (fam, units, correct)
        v = self._memo_small.get(key)
        if v is None:
            N = math.ceil(units / block)
            v = self.layers * float(self.kernel_time2(fam, N, 0.0, units / N * unit_bytes))
            if correct and self.corr:
                v *= float(self._corr(fam, "", np.log2(units)))
            if len(self._memo_small) > _MEMO_MAX:
                self._memo_small.clear()
            self._memo_small[key] = v
        return v

    def merge_time2(self, rows: int, correct: bool = True) -> float:
        """Seconds (all layers) of the LSE merge over ``rows`` (token, head) rows."""
        return self._streaming_time2("merge", rows, self.merge_block, self.merge_row_bytes, correct)

    def kv_write_time2(self, tokens: int, correct: bool = True) -> float:
        """Seconds (all layers) of writing ``tokens`` tokens' K and V rows into their slots."""
        return self._streaming_time2("kv_write", tokens, self.kvw_block, 2.0 * self.kvb, correct)
