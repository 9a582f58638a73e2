"""Fit the cost model's coefficients (``attn.form = 2``) to raw calibration data.

numpy/pandas and scipy's bounded least squares (fitting.py says why). Each operator family's
coefficients are fitted on the log of predicted / measured time (a relative-error least squares), parameters in log space,
several starts; predictions come from :mod:`granisim.costmodel` itself (the same code the
simulator runs), per layer. 20% of each family's points (seeded) are held out and only used to
report the error.

Order (later stages hold the earlier ones fixed): ceilings (meta) -> merge, KV write, KV copy ->
cascade, dense, decode on slab rows -> storage gather efficiencies (page 1, page 16) on the
non-slab decode / cascade rows -> prefill (extend) -> linear operators (roofline per family; the
measured table itself is what the measured profile uses) -> per-step overhead. The linear and
host-time pieces live in fit_linear.py; the shared error and fold helpers and the solver in fitting.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from granisim.config.coefficients import KERNEL_MODEL_COEFFICIENTS, L2_STREAMS
from granisim.config.models import ModelShape, get_model

from .fit_linear import fit_linear, host_bound, host_floor, step_overhead, vidur_table
from .fitting import bounded_fit, folds_of, rel_err, summary
from .raw import Raw, hbm_ceiling, kernel_table_of, predict_attention, prepare_rows

# (name, lower, upper) of each fitted parameter; an efficiency is at most 1
EFF = (1e-3, 1.0)
# but a stream served mostly from L2 (coefficients.L2_STREAMS), which may run faster than HBM
L2_EFF = (1e-3, 4.0)
LAUNCH = (1e-7, 1e-4)
PROGRAM = (1e-8, 1e-4)
SAT = (0.05, 16.0)
RESIDENT = (1, 2, 4, 8, 16)  # tried one by one (programs per SM is a whole number)


def _wave(pre, flop, mem):
    names = [(pre + "launch_s", *LAUNCH), (pre + "program_s", *PROGRAM)]
    if flop:
        names.append((flop, *EFF))
    return names + [(mem, *(L2_EFF if mem in L2_STREAMS else EFF)), (pre + "sat_ctas_per_sm", *SAT)]


FAMILY_PARAMS = {
    "merge": _wave("attn.merge.", None, "attn.merge.mem_eff"),
    "kv_write": _wave("kv.write_", None, "kv.write_eff"),
    "kv_copy": [("kv.copy_launch_s", *LAUNCH), ("kv.copy_eff", *EFF)],
    **{p: _wave(f"attn.{p}.", f"attn.{p}.flop_eff", f"attn.{p}.mem_eff") for p in ("cascade", "dense")},
    "prefill": _wave("attn.prefill.", "attn.prefill.flop_eff", "attn.prefill.mem_eff")
    + [("attn.prefill.page1_eff", *EFF), ("attn.prefill.page16_eff", *EFF)],
    "decode": _wave("attn.decode.", None, "attn.decode.mem_eff"),
    "storage": [("storage.page1_eff", *EFF), ("storage.page16_eff", *EFF)],
}
DISCRETE = {**{p: f"attn.{p}.resident_ctas_per_sm" for p in ("merge", "cascade", "dense", "decode")},
            "kv_write": "kv.write_resident_ctas_per_sm"}
RAW_FAMILY = {"prefill": "extend"}  # cost-model family -> raw family column

# Kernel facts of gpu_backend at the measured commit. A raw row is priced with the splits its launch recorded
# (n_splits, chunk: raw.predict_attention), so a later change of a split rule leaves the fit as it was;
# split_check reports how many recorded splits today's rule still gives. The prefill kernel's 128-row tiles (8 warps,
# 3 stages of 128-token K and V tiles beside the Q tile: about 224 KB of shared memory, gpu_backend.kernels.extend
# default_tiles) leave room for one program per SM; the rows of a power-of-two grid cannot tell 1 from 2, Qwen-2.5-14B's
# 160-program prefills can (1.8-1.9x the time of 128 programs: calibration/raw/h100/qwen-2.5-14b_extend).
KERNEL_RULES = {"attn.prefill.m_tile": 128, "attn.prefill.resident_ctas_per_sm": 1,
                "attn.decode.m_tile": 16, "attn.cascade.m_tile": 128,
                "attn.cascade.min_m_tile": 16, "attn.cascade.ctas_per_sm": 1, "attn.cascade.gather_ctas_per_sm": 2,
                "attn.cascade.min_split_tokens": 256, "attn.cascade.max_splits": 64, "attn.cascade.launches": 2,
                "attn.cascade.balance_chunk": 1024, "attn.cascade.balance_skew": 2,
                "attn.dense.m_tile": 128, "attn.dense.max_splits": 16, "attn.dense.launches": 2,
                "storage.slab_eff": 1.0, "attn.form": 2}


def _resident_fit(values: dict, fam: str, rows: pd.DataFrame, model: ModelShape, r: int) -> tuple[float, dict]:
    v = dict(values)
    v[DISCRETE[fam]] = r
    return fit_params(v, FAMILY_PARAMS[fam], rows, model, _starts(FAMILY_PARAMS[fam]), return_cost=True), v


def fit_family(values: dict, fam: str, rows: pd.DataFrame, model: ModelShape, warm: bool = False, pool=None):
    """Fit family ``fam``'s parameters (and its whole-number one, by trying each) to ``rows``.
    ``warm``: one start, from ``values`` as they are, whole-number parameter kept (a re-fit near a
    known solution: the cross-validation folds). ``pool``: an executor the whole-number values are
    tried on in parallel (the same result as one by one)."""
    names = FAMILY_PARAMS[fam]
    disc = DISCRETE.get(fam)
    if warm:
        fit_params(values, names, rows, model)
        return values
    if disc is None:
        fit_params(values, names, rows, model, _starts(names))
        return values
    if pool is not None:
        tried = [f.result() for f in [pool.submit(_resident_fit, values, fam, rows, model, r) for r in RESIDENT]]
    else:
        tried = (_resident_fit(values, fam, rows, model, r) for r in RESIDENT)
    best = None
    for cost, v in tried:
        if best is None or cost < best[0] - 1e-12:
            best = (cost, v)
    values.update(best[1])
    return values


def fit_params(values: dict, names, rows: pd.DataFrame, model: ModelShape, starts=None, return_cost=False):
    """Fit ``names`` [(name, lo, hi)] in ``values`` (updated in place) to ``rows`` (log residuals)."""
    meas = rows["median_us"].to_numpy(float) * 1e-6
    keys = [n for n, _, _ in names]
    lo = np.log([lo for _, lo, _ in names])
    hi = np.log([hi for _, _, hi in names])

    prepared = prepare_rows(rows)

    def resid(x):
        v = dict(values)
        v.update(zip(keys, np.exp(x)))
        pred = predict_attention(v, prepared, model)
        return np.log(np.maximum(pred, 1e-15) / meas)

    inits = [np.log([values[k] for k in keys])]
    for s in starts or ():
        inits.append(np.log([s.get(k, values[k]) for k in keys]))
    best = None
    for x0 in inits:
        x, c = bounded_fit(resid, np.clip(x0, lo, hi), lo, hi)
        if best is None or c < best[1]:
            best = (x, c)
    values.update(zip(keys, np.exp(best[0]).tolist()))
    return best[1] if return_cost else values


# ---- the whole fit ----------------------------------------------------------------------------------
@dataclass
class FitResult:
    values: dict
    errors: dict = field(default_factory=dict)        # family -> {"heldout": {...}, "train": {...}}
    residuals: pd.DataFrame | None = None             # every row: family, pred_s, meas_s, heldout
    linear_table: pd.DataFrame | None = None          # Vidur-format measured table (ms)
    notes: dict = field(default_factory=dict)         # coefficient -> how it was obtained
    split_check: dict = field(default_factory=dict)


def initial_values(base: dict, meta: dict) -> dict:
    """Start values: ``base`` coefficients, the kernel rules, ceilings and SM count from ``meta``."""
    v = dict(base)
    for k, (_, _, default) in KERNEL_MODEL_COEFFICIENTS.items():
        v.setdefault(k, default)
    v.update(KERNEL_RULES)
    c = meta.get("ceilings") or {}
    if c.get("copy_Bps"):
        v["hbm_bandwidth"] = float(c["copy_Bps"])
    if meta.get("max_stream_Bps"):  # the fastest HBM stream measured (see hbm_ceiling)
        v["hbm_bandwidth"] = max(v["hbm_bandwidth"], float(meta["max_stream_Bps"]))
    if c.get("gemm_flops"):
        v["bf16_flops"] = float(c["gemm_flops"])
    if meta.get("sms"):
        v["sm_count"] = int(meta["sms"])
    if meta.get("gpu_mem_bytes"):
        v["memory_bytes"] = float(meta["gpu_mem_bytes"])
    for pre in ("attn.prefill.", "attn.decode.", "attn.cascade.", "attn.dense.", "attn.merge.", "kv.write_"):
        v[pre + "launch_s"] = 3e-6
        v[pre + "program_s"] = 1e-6
        v[pre + "sat_ctas_per_sm"] = 1.0
    v["kv.copy_launch_s"] = 4e-6
    for p in ("prefill", "decode", "cascade", "dense"):
        v[f"attn.{p}.mem_eff"] = 0.8
    v["attn.dense.flop_eff"] = v["attn.cascade.flop_eff"] = v["attn.prefill.flop_eff"] = 0.5
    v["storage.page1_eff"] = v["storage.page16_eff"] = 0.8
    v["attn.merge.mem_eff"] = v["kv.write_eff"] = v["kv.copy_eff"] = 0.8  # start values never come from `base`
    v["attn.prefill.page1_eff"] = v["attn.prefill.page16_eff"] = 0.8
    return v


STARTS = [{"sat": 0.5, "eff": 0.5, "prog": 3e-7}, {"sat": 2.0, "eff": 0.9, "prog": 1.5e-6},
          {"sat": 1.0, "eff": 0.95, "prog": 3e-6}]


def _starts(names):
    out = []
    for s in STARTS:
        d = {}
        for n, _, _ in names:
            if n.endswith("sat_ctas_per_sm"):
                d[n] = s["sat"]
            elif n.endswith("_eff"):
                d[n] = s["eff"]
            elif n.endswith("program_s"):
                d[n] = s["prog"]
        out.append(d)
    return out


ATTENTION_FITS = 8  # fit_family calls of one fit_attention_rows (progress units)


def fit_attention_rows(train: pd.DataFrame, values: dict, model: ModelShape, warm: bool = False,
                       tick=lambda: None, pool=None) -> dict:
    """Fit every attention / KV family's coefficients to ``train`` (attention.csv rows); ``warm``:
    see :func:`fit_family`; ``tick()`` after each family."""
    slab = train["storage"].fillna("") == "slab"

    def fit_one(fam, r):
        if len(r):
            fit_family(values, fam, r, model, warm, pool)
        tick()

    def rows(fam, only_slab=False):
        r = train[train["family"] == RAW_FAMILY.get(fam, fam)]
        return r[r["storage"] == "slab"] if only_slab else r

    for fam in ("merge", "kv_write", "kv_copy"):
        fit_one(fam, rows(fam))
    for fam in ("cascade", "dense", "decode"):
        fit_one(fam, rows(fam, only_slab=True))
    values["attn.decode.flop_eff"] = values["attn.cascade.flop_eff"]  # never binding for decode (G rows)
    fit_one("storage", train[train["family"].isin(["decode", "cascade"]) & ~slab])
    fit_one("prefill", rows("prefill"))
    return values


def fit_attention(raw: Raw, values: dict, model: ModelShape, seed: int = 0, folds: int = 5, tick=lambda: None,
                  pool=None):
    """Coefficients fitted on every row (several starts, every whole-number value tried); held-out
    errors by cross-validation: per fold, the coefficients are re-fitted on the other rows only, one
    start from the all-rows solution with its whole-number values kept, and predict the fold's rows
    together with the measured correction (kernel table) of the other rows. (The warm start makes the
    folds ~20x cheaper than fits from scratch; it also lets the held-out rows choose the start point
    and the whole-number values, a small optimistic bias of the held-out errors.)
    Returns (values, residual frame, errors)."""
    df = raw.attention.copy().reset_index(drop=True)
    df = df[~host_bound(df, host_floor(raw))].reset_index(drop=True)  # none in the H200 run
    df["meas_s"] = df["median_us"] * 1e-6
    fold = folds_of(df, folds, seed)
    df["heldout"] = fold >= 0
    df["fold"] = fold
    df["pred_s"] = np.nan
    df["formula_s"] = np.nan
    values = fit_attention_rows(df, values, model, tick=tick, pool=pool)
    ks = sorted(set(fold[fold >= 0]))
    if pool is not None:  # the folds in parallel
        jobs = [pool.submit(fit_attention_rows, df[fold != k], dict(values), model, True) for k in ks]
    for i, k in enumerate(ks):
        train = df[fold != k]
        if pool is not None:
            v = jobs[i].result()
            for _ in range(ATTENTION_FITS):
                tick()
        else:
            v = fit_attention_rows(train, dict(values), model, warm=True, tick=tick)
        h = fold == k
        df.loc[h, "formula_s"] = predict_attention(v, df[h], model)
        df.loc[h, "pred_s"] = predict_attention(v, df[h], model, table=kernel_table_of(train, model))
    nh = ~df["heldout"].to_numpy()
    if nh.any():  # rows never held out (folds = 1): the final coefficients and table
        df.loc[nh, "formula_s"] = predict_attention(values, df[nh], model)
        df.loc[nh, "pred_s"] = predict_attention(values, df[nh], model, table=kernel_table_of(df, model))
    errors = {}
    for fam, g in df.groupby("family"):
        h = g[g.heldout]
        errors[fam] = {"heldout": summary(rel_err(h.pred_s, h.meas_s)),
                       "formula_heldout": summary(rel_err(h.formula_s, h.meas_s))}
    return values, df, errors


def split_check(raw: Raw, values: dict, model: ModelShape) -> dict:
    """How often the cost model's split rule (today's) gives the splits the launchers recorded, in all and per
    family (``by_family``: family -> [agree, rows]). Informational: the fit prices each row with its recorded
    splits; a rule changed since the run (the dense rule, 2026-12-06) disagrees on the rows it now splits
    differently."""
    from granisim.costmodel import CostTables

    from .raw import layer_model, profile_of

    df = raw.attention
    if "n_splits" not in df.columns:
        return {"rows": 0, "agree": 0, "examples": []}
    df = df[df["family"].isin(["decode", "cascade", "dense"]) & pd.to_numeric(df["n_splits"], errors="coerce").notna()]
    prof = profile_of(values)
    agree = total = 0
    bad = []
    fams: dict = {}
    for _, r in df.iterrows():
        t = CostTables(prof, layer_model(model, int(r.G)))
        gather = r.storage != "slab"
        if r.family == "decode":
            n, _ = t.split_rule(t.n_kv * r.B, r.L, 64.0, gather=gather and t.dec_tile <= 64)
        else:
            m = float(r.M_eff)
            if r.family == "cascade":
                bm = min(128.0, max(16.0, 2.0 ** np.ceil(np.log2(max(m, 1.0)))))
                n, _ = t.split_rule(np.ceil(m / bm) * t.n_kv, r.L, 64.0 if bm <= 64 else 128.0,
                                    gather=gather and bm <= 64)
            else:
                n, _ = t.dense_split_rule(np.array([np.ceil(m / 128.0) * t.n_kv]), r.L)
        total += 1
        f = fams.setdefault(r.family, [0, 0])
        f[1] += 1
        if int(np.asarray(n).ravel()[0]) == int(float(r.n_splits)):
            agree += 1
            f[0] += 1
        elif len(bad) < 5:
            bad.append(f"{r.family} {r.storage} L={r.L} B={r.B}: model {int(np.asarray(n).ravel()[0])}, "
                       f"kernel {int(float(r.n_splits))}")
    return {"rows": total, "agree": agree, "examples": bad, "by_family": fams}


def fit(raw: Raw, base_values: dict, seed: int = 0, folds: int = 5, progress: bool = False,
        workers: int | None = None) -> FitResult:
    """Every coefficient of a form-2 profile from ``raw`` (``base_values``: start values); held-out
    errors by ``folds``-fold cross-validation (each fold holds out ~20% of each family's points;
    ``folds = 1``: one seeded 20% hold-out). ``progress``: a progress bar on stderr. ``workers``:
    local processes for the independent pieces (whole-number values, folds; default: the CPU
    count, at most 5); the result does not depend on it."""
    import contextlib
    import os

    from tqdm import tqdm

    from granisim.experiments.stopping import process_pool

    workers = min(workers or os.cpu_count() or 1, len(RESIDENT))

    model = get_model(raw.meta.get("model", "llama-3.1-8b"))
    bw, bw_how = hbm_ceiling(raw)
    values = initial_values(base_values, {**raw.meta, "max_stream_Bps": bw})
    bar = tqdm(total=ATTENTION_FITS * (1 + max(1, folds)) + 1, desc="fit", unit="family", disable=not progress)
    try:
        with (process_pool(workers) if workers > 1 else contextlib.nullcontext()) as pool:
            values, att, errors = fit_attention(raw, values, model, seed, folds, tick=lambda: bar.update(1),
                                                pool=pool)
        bar.set_description("fit linear")
        values, lin, lerr = fit_linear(raw, values, model, seed, folds)
        bar.update(1)
    finally:
        bar.close()
    errors.update(lerr)
    values["overhead.step_s"], how = step_overhead(raw)
    errors["linear_censored"] = {"rows": int(lin["censored"].sum()), "of": int(len(lin)),
                                 "families": sorted(set(lin.loc[lin["censored"], "family"])),
                                 "host_floor_us": host_floor(raw)}
    small = att[att["family"].isin(["merge", "kv_write"])]
    values["overhead.kernel_launch_s"] = float(np.median([values["attn.merge.launch_s"], values["kv.write_launch_s"]]))
    res = pd.concat([att.assign(kind="attention")[["family", "storage", "G", "B", "L", "M_eff", "q_len", "T",
                                                   "meas_s", "pred_s", "formula_s", "heldout"]],
                     lin.assign(kind="linear")[["family", "n", "meas_s", "pred_s", "table_s", "heldout", "censored"]]],
                    ignore_index=True)
    out = FitResult(values, errors, res, vidur_table(lin[lin["family"] != "lm_head"]),
                    notes={"overhead.step_s": how, "hbm_bandwidth": bw_how})
    out.split_check = split_check(raw, values, model)
    del small
    return out
