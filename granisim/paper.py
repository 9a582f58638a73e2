"""The paper's claims in simulation (``granisim paper``): ``reports/paper/``.

For each hardware profile, one sweep (the :mod:`granisim.sweep` machinery: parallel,
resumable) runs every point the claims need; the table puts the paper's figure beside
ours and, for each ratio, the cost-model terms (``t_*`` totals of ``steps.parquet``,
summed over the run) that moved most between the two policies. Then the beyond-the-paper
sweeps in ``sweeps/`` (adaptive HOT, dispatch, M_sat, tenancy) run on the first profile
and are summarised with their plots.

Throughput is measured at saturation: every point's requests arrive within a few seconds
(``workload.rate`` far above what the engine serves), so completed requests / makespan is
the engine's maximum. The paper's own figures are quoted from arXiv 2608.15584; nothing
of ours is typed in — every number below is read from the results tables this command
writes.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.hardware import get_profile
from granisim.sweep import run_sweep
from granisim.sweepfile import point_id, sweep_from_dict

PAPER = "GraniKV paper, arXiv 2608.15584"
MODELS = ("llama-3.1-8b", "qwen-2.5-14b", "qwen-2.5-32b")
HEADLINE = {"llama-3.1-8b": 2.16, "qwen-2.5-14b": 1.98, "qwen-2.5-32b": 1.57}  # paper: granikv / SGLang, L_p = 16K
STORAGE_ALONE = 1.95  # paper: heterogeneous multi-prefix, storage alone
PARITY = 0.97  # paper: short-prefix parity, at least
DISPATCH_REGRESSION = 0.30  # paper: up to 30% regression without dispatch (small L_p / large B)
BASE = {"name": "paper", "seed": 0,
        "workload": {"kind": "multi_agent", "roles": 4, "prefix_len": 16384}}
LARGE_B = {"workload.roles": 1, "workload.suffix_scale": 0.1, "workload.max_output_len": 256,
           "scheduler.max_running": 1024, "workload.num_requests": 1500, "workload.rate": 1000.0}
HOT_VALUES = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, "adaptive")
DISPATCH_LP = (256, 1024, 4096)
TERMS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write", "kv_copy",
         "overhead")
BEYOND = ("adaptive_hot", "dispatch", "dispatch_tenancy", "msat", "tenancy")


def _points(num_requests: int) -> list[dict]:
    """Every point the claims need (the same resolved scenario twice runs once)."""
    pts = []
    for m in MODELS:  # headline: three models at L_p = 16K, k = 4
        pts += [{"model.name": m, "policy.name": p} for p in ("granikv", "token", "paged16")]
        pts.append({"model.name": m, "policy.hot_fraction": "adaptive"})
    pts += [{"model.name": "qwen-2.5-32b", "workload.roles": 1, "policy.name": p} for p in ("granikv", "token")]
    pts.append({"model.name": "qwen-2.5-32b", "workload.roles": 1, "policy.hot_fraction": "adaptive"})
    pts += [{"policy.dispatch": "cascade"}, {"policy.dispatch": "dense"}]  # storage alone / dense forced
    for m in MODELS:  # short-prefix control
        pts += [{"model.name": m, "workload.kind": "control", "workload.prefix_len": 64, "policy.name": p}
                for p in ("granikv", "token")]
        pts.append({"model.name": m, "workload.kind": "control", "workload.prefix_len": 64,
                    "policy.hot_fraction": "adaptive"})
    for k in (4, 64):  # tenancy
        for p in ("granikv", "token", "paged16"):
            pts += [{"workload.roles": k, "policy.name": p, "scheduler.admission": a} for a in ("fcfs", "prefix")]
    for lp in DISPATCH_LP:  # small L_p / large B
        pts.append({**LARGE_B, "workload.prefix_len": lp, "policy.name": "token"})
        pts += [{**LARGE_B, "workload.prefix_len": lp, "policy.dispatch": d}
                for d in ("threshold", "cost", "auto", "cascade", "dense")]
    for k in (4, 16):  # hot_fraction sensitivity
        pts.append({"workload.roles": k, "policy.name": "token"})
        pts += [{"workload.roles": k, "policy.hot_fraction": h} for h in HOT_VALUES]
    return pts


def _spec(profile: str, num_requests: int, rate: float):
    raw = {"name": f"paper-{profile}", "base": BASE,
           "set": {"hardware.profile": profile, "workload.num_requests": num_requests, "workload.rate": rate},
           "points": _points(num_requests)}
    return sweep_from_dict(raw, f"<paper {profile}>", check_setup=False)


class Results:
    """Rows of one profile's sweep, looked up by the overrides that define them."""

    def __init__(self, spec, df: pd.DataFrame):
        self.spec, self.df = spec, df.set_index("point_id", drop=False)
        self.base = spec.base
        prof = get_profile(spec.base.hardware.profile)
        self.p1 = prof["storage.page1_eff"]
        from granisim.models import get_model

        self.G = get_model(spec.base.model.name).group_size

    def get(self, over: dict) -> pd.Series:
        return self.df.loc[point_id(self.base.with_changes(**over))]


def _terms(a: pd.Series, b: pd.Series, n: int = 3) -> str:
    """The cost-model terms that moved most from baseline ``b`` to target ``a`` (seconds over the run)."""
    d = sorted(TERMS, key=lambda k: -abs(b[f"t_{k}_s"] - a[f"t_{k}_s"]))[:n]
    return "; ".join(f"{k} {b[f't_{k}_s']:.1f}→{a[f't_{k}_s']:.1f} s" for k in d)


def _total(a: pd.Series) -> float:
    return float(sum(a[f"t_{k}_s"] for k in TERMS))


def _share(a: pd.Series, *terms: str) -> float:
    return float(sum(a[f"t_{k}_s"] for k in terms)) / _total(a)


def _ratio(a: pd.Series, b: pd.Series) -> float:
    return float(a.throughput_rps / b.throughput_rps)


def claims(r: Results) -> list[dict]:
    rows = []
    for m in MODELS:
        g, t = r.get({"model.name": m, "policy.name": "granikv"}), r.get({"model.name": m, "policy.name": "token"})
        p16 = r.get({"model.name": m, "policy.name": "paged16"})
        ad = r.get({"model.name": m, "policy.hot_fraction": "adaptive"})
        rows.append(dict(claim=f"{m}, L_p = 16K, k = 4: granikv / token (SGLang default) throughput",
                         paper=f"{HEADLINE[m]:.2f}x", paper_value=HEADLINE[m], ours=_ratio(g, t),
                         extra=f"vs paged16 {_ratio(g, p16):.2f}x; adaptive HOT {_ratio(ad, t):.2f}x; KV budget {int(g.kv_budget_tokens)} tokens "
                               f"({int(g.kv_budget_tokens) // 16384} prefixes of 16K); mean batch "
                               f"{g.mean_batch:.0f} vs {t.mean_batch:.0f}; hit rate {g.prefix_hit_rate:.2f} vs "
                               f"{t.prefix_hit_rate:.2f}",
                         terms=_terms(g, t),
                         reading=(f"token spends {_share(t, 'attn_decode'):.0%} of its step time in attn_decode "
                                  f"(every request re-reads its 16K prefix at storage.page1_eff = {r.p1:g}); "
                                  f"granikv reads each prefix once per group (attn_prefix {_share(g, 'attn_prefix'):.0%}"
                                  f" of its time) and is left with linear {_share(g, 'linear'):.0%}, prefill "
                                  f"{_share(g, 'attn_prefill'):.0%}" if g.mean_batch >= 4 else
                                  f"the KV budget ({int(g.kv_budget_tokens)} tokens) holds one 16K prefix at a time: "
                                  f"batch {g.mean_batch:.1f}, hit rate {g.prefix_hit_rate:.2f}, linear (prefix "
                                  f"recompute) is {_share(g, 'linear'):.0%} of the time for both: nothing to share")))
        if m == "qwen-2.5-32b":
            g1 = r.get({"model.name": m, "workload.roles": 1, "policy.name": "granikv"})
            t1 = r.get({"model.name": m, "workload.roles": 1, "policy.name": "token"})
            a1 = r.get({"model.name": m, "workload.roles": 1, "policy.hot_fraction": "adaptive"})
            rows.append(dict(claim=f"{m}, L_p = 16K, k = 1 (assumption: one prefix, since 4 x 16K exceed "
                                   f"the KV budget)", paper=f"{HEADLINE[m]:.2f}x", paper_value=HEADLINE[m],
                             ours=_ratio(g1, t1), extra=f"adaptive HOT {_ratio(a1, t1):.2f}x; static 0.2 HOT = "
                                                       f"{int(0.2 * g1.kv_budget_tokens)} tokens "
                                                       f"({'<' if 0.2 * g1.kv_budget_tokens < 16384 else '>='} one "
                                                       f"16K prefix), {int(g1.hot_fallbacks)} HOT fallbacks to "
                                                       f"COLD; mean batch {g1.mean_batch:.0f} vs "
                                                       f"{t1.mean_batch:.0f} (adaptive {a1.mean_batch:.0f})",
                             terms=_terms(g1, t1),
                             reading=(f"static HOT (20% = {int(0.2 * g1.kv_budget_tokens)} tokens) cannot hold the "
                                      f"prefix, so it is dead memory and the prefix sits in COLD: batch "
                                      f"{g1.mean_batch:.1f} vs {t1.mean_batch:.1f}, linear {g1.t_linear_s:.0f} vs "
                                      f"{t1.t_linear_s:.0f} s; adaptive HOT gives HOT exactly the prefix"
                                      if 0.2 * g1.kv_budget_tokens < 16384 else
                                      f"the prefix fits the static HOT share; the share beyond it "
                                      f"({int(0.2 * g1.kv_budget_tokens) - 16384} tokens) is missing from COLD: batch "
                                      f"{g1.mean_batch:.1f} vs {t1.mean_batch:.1f}; adaptive HOT "
                                      f"{a1.mean_batch:.1f}")))
    g, t = r.get({"policy.dispatch": "cascade"}), r.get({"policy.name": "token"})
    th = r.get({})
    dense_share = th.dense_groups / max(1, th.dense_groups + th.cascade_groups)
    rows.append(dict(claim="multi-prefix (k = 4 roles, one 16K prompt each), llama-3.1-8b: storage alone "
                           "(granikv layout, dispatch forced to cascade) / token",
                     paper=f"{STORAGE_ALONE:.2f}x", paper_value=STORAGE_ALONE, ours=_ratio(g, t),
                     extra=f"with threshold dispatch {_ratio(r.get({}), t):.2f}x; dense forced "
                           f"{_ratio(r.get({'policy.dispatch': 'dense'}), t):.2f}x",
                     terms=_terms(g, t),
                     reading=f"groups average {g.mean_group_size:.0f} requests (M_eff ≈ {g.mean_group_size * r.G:.0f}; "
                             f"M_sat = {int(th.m_sat)}): threshold dispatch takes dense in {dense_share:.0%} of group "
                             f"steps, and storage alone keeps {(_ratio(g, t) - 1) / max(1e-9, _ratio(th, t) - 1):.0%} "
                             f"of granikv's gain; token's attn_decode is {_share(t, 'attn_decode'):.0%} of its time"))
    for m in MODELS:
        c = {"model.name": m, "workload.kind": "control", "workload.prefix_len": 64}
        g, t = r.get({**c, "policy.name": "granikv"}), r.get({**c, "policy.name": "token"})
        ad = r.get({**c, "policy.hot_fraction": "adaptive"})
        rows.append(dict(claim=f"short-prefix parity ({m}, L_p = 64, k = 4): granikv / token",
                         paper=f">= {PARITY:.2f}x", paper_value=PARITY, ours=_ratio(g, t),
                         extra=f"adaptive HOT {_ratio(ad, t):.3f}x; KV budget {int(g.kv_budget_tokens)} tokens, "
                               f"mean batch {g.mean_batch:.0f} vs {t.mean_batch:.0f} (adaptive {ad.mean_batch:.0f})",
                         terms=_terms(g, t),
                         reading=(f"a 64-token prefix saves little attention (attn_decode {t.t_attn_decode_s:.1f} → "
                                  f"{g.t_attn_decode_s:.1f} s)" + (
                                      f"; memory binds here, and the static 20% HOT share shrinks COLD: batch "
                                      f"{g.mean_batch:.0f} vs {t.mean_batch:.0f}, so more steps and more linear time "
                                      f"(the term above); adaptive HOT restores the batch"
                                      if g.mean_batch < 0.97 * t.mean_batch else
                                      "; memory does not bind, so the HOT share costs nothing"))))
    thr = {}
    for p in ("granikv", "token", "paged16"):
        lo = r.get({"workload.roles": 64, "policy.name": p, "scheduler.admission": "fcfs"})
        hi = r.get({"workload.roles": 4, "policy.name": p, "scheduler.admission": "fcfs"})
        thr[p] = (lo, hi)
    tok64 = thr["token"][0]
    rows.append(dict(claim="tenancy k = 64 (16K prefixes, llama-3.1-8b, FCFS): every paged engine thrashes",
                     paper="all thrash", paper_value=None,
                     ours=_ratio(thr["granikv"][0], tok64),
                     extra="throughput at k = 64 / at k = 4: " + ", ".join(
                         f"{p} {lo.throughput_rps / hi.throughput_rps:.2f}" for p, (lo, hi) in thr.items())
                           + "; prefix hit rate at k = 64: " + ", ".join(
                         f"{p} {lo.prefix_hit_rate:.2f}" for p, (lo, _) in thr.items())
                           + f"; paged16 / token {_ratio(thr['paged16'][0], tok64):.2f}x; with prefix-grouped "
                             f"admission (beyond the paper) at k = 64: " + ", ".join(
                         f"{p} {r.get({'workload.roles': 64, 'policy.name': p, 'scheduler.admission': 'prefix'}).throughput_rps / lo.throughput_rps:.2f}x FCFS"
                         for p, (lo, _) in thr.items()),
                     terms=_terms(thr["granikv"][0], tok64),
                     reading=f"64 x 16K prefixes exceed the KV budget: every policy loses its cache alike and "
                             f"recomputes prefixes — linear + attn_prefill are {_share(tok64, 'linear', 'attn_prefill'):.0%}"
                             f" of token's and {_share(thr['granikv'][0], 'linear', 'attn_prefill'):.0%} of granikv's "
                             f"time, and the layout does not change them"))
    for lp in DISPATCH_LP:
        c = {**LARGE_B, "workload.prefix_len": lp}
        t = r.get({**c, "policy.name": "token"})
        res = {d: r.get({**c, "policy.dispatch": d}) for d in ("threshold", "cost", "auto", "cascade", "dense")}
        worst = min(("cascade", "dense"), key=lambda d: _ratio(res[d], t))
        rows.append(dict(claim=f"small L_p / large B (L_p = {lp}, one role, batch ~{res['threshold'].mean_batch:.0f}): "
                               f"granikv without dispatch (worst forced path: {worst}) / token",
                         paper=f"up to {DISPATCH_REGRESSION:.0%} regression", paper_value=1 - DISPATCH_REGRESSION,
                         ours=_ratio(res[worst], t),
                         extra="with dispatch: " + ", ".join(f"{d} {_ratio(res[d], t):.3f}x"
                                                             for d in ("threshold", "cost", "auto"))
                               + f"; forced cascade {_ratio(res['cascade'], t):.3f}x, dense "
                                 f"{_ratio(res['dense'], t):.3f}x",
                         terms=_terms(res[worst], res["threshold"]),
                         reading=f"attn_prefix + merge are {_share(res[worst], 'attn_prefix', 'merge'):.1%} of the "
                                 f"step time with the worst forced path (linear {_share(res[worst], 'linear'):.0%}): "
                                 f"no path choice can cost 30% in this cost model; a regression of the paper's size "
                                 f"would need kernel costs the profile does not have (launch gaps, split/merge "
                                 f"overheads at large B) — the calibration run can tell"))
    for k in (4, 16):
        t = r.get({"workload.roles": k, "policy.name": "token"})
        vals = {h: _ratio(r.get({"workload.roles": k, "policy.hot_fraction": h}), t) for h in HOT_VALUES}
        static = {h: v for h, v in vals.items() if h != "adaptive"}
        best = max(static, key=static.get)
        rows.append(dict(claim=f"hot_fraction sensitivity around 0.2 (k = {k}, L_p = 16K): granikv / token",
                         paper="static 0.2", paper_value=None, ours=vals[0.2],
                         extra=", ".join(f"{h}: {v:.3f}x" for h, v in vals.items()) + f"; best static {best}",
                         terms=_terms(r.get({"workload.roles": k, "policy.hot_fraction": best}),
                                      r.get({"workload.roles": k, "policy.hot_fraction": 0.2})),
                         reading=f"static values span {min(static.values()):.3f}x … {max(static.values()):.3f}x: "
                                 f"below the prefixes' total ({k} x 16K = {k * 16384} tokens, "
                                 f"{k * 16384 / r.get({'workload.roles': k}).kv_budget_tokens:.0%} of the budget) "
                                 f"some prefixes fall back to COLD (page-1 reads), above it COLD shrinks; adaptive "
                                 f"{vals['adaptive']:.3f}x"))
    return rows


def _coeffs(profile: str) -> str:
    p = get_profile(profile)
    keys = ("m_sat", "storage.page1_eff", "storage.page16_eff", "storage.slab_eff", "attn.decode.mem_eff",
            "attn.cascade.mem_eff", "attn.dense.flop_eff", "overhead.step_s")
    out = []
    for k in keys:
        c = p.coefficients.get(k)
        if c is not None:
            out.append(f"`{k}` = {c.value:g} ({c.source.kind})")
    return ", ".join(out)


def _md_table(rows: list[dict]) -> str:
    lines = ["| claim | paper | ours | detail | terms that moved most (baseline → target, s over the run) | "
             "reading (from the same rows) |", "| --- | --- | --- | --- | --- | --- |"]
    for x in rows:
        lines.append(f"| {x['claim']} | {x['paper']} | **{x['ours']:.2f}x** | {x['extra']} | {x['terms']} | "
                     f"{x.get('reading', '')} |")
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path, title: str) -> None:
    from granisim.report import plt, save_figure  # report sets the Agg backend

    rs = [x for x in rows if x["paper_value"] is not None]
    fig, ax = plt.subplots(figsize=(14, 6))
    y = np.arange(len(rs))
    ax.barh(y - 0.2, [x["paper_value"] for x in rs], 0.4, label="paper (arXiv 2608.15584)")
    ax.barh(y + 0.2, [x["ours"] for x in rs], 0.4, label="granisim")
    ax.set_yticks(y, [x["claim"][:70] for x in rs], fontsize=7)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("throughput ratio (x)")
    ax.invert_yaxis()
    ax.legend()
    ax.set_title(title)
    save_figure(fig, path)


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _beyond(name: str, df: pd.DataFrame, spec) -> dict:
    """Summaries of the beyond-the-paper sweeps, computed from their tables."""
    from granisim.sweepplots import add_speedup

    if name == "adaptive_hot":
        sp = add_speedup(df, spec.speedup, spec.varied)
        out, worst = [], 0.0
        for (k, lp), g in sp.groupby(["workload.roles", "workload.prefix_len"]):
            static = g[g["policy.hot_fraction"].astype(str) != "adaptive"]
            best = static.loc[static.throughput_rps.idxmax()]
            ad = g[g["policy.hot_fraction"].astype(str) == "adaptive"].iloc[0]
            rel = ad.throughput_rps / best.throughput_rps
            worst = min(worst, rel - 1)
            out.append({"k": int(k), "L_p": int(lp), "best_static": best["policy.hot_fraction"],
                        "best_static_speedup": float(best.speedup), "adaptive_speedup": float(ad.speedup),
                        "adaptive_over_best": float(rel), "adaptive_hot_end": int(ad.hot_capacity_end)})
        wins = sum(x["adaptive_over_best"] >= 1 - 1e-9 for x in out)
        return {"points": out, "matches_or_beats": wins, "of": len(out), "worst_shortfall": max(0.0, -worst)}
    if name in ("dispatch", "dispatch_tenancy"):
        sp = add_speedup(df, spec.speedup, spec.varied)
        axes = ["workload.prefix_len", "scheduler.max_running" if name == "dispatch" else "workload.roles"]
        modes = [d for d in ("threshold", "cost", "auto", "cascade", "dense") if d in set(sp["policy.dispatch"])]
        out = []
        for (lp, b), g in sp.groupby(axes):
            v = {d: float(g[g["policy.dispatch"] == d].speedup.iloc[0]) for d in modes}
            best = max(v.values())
            out.append({"L_p": int(lp), "axis": int(b), "mean_batch": float(g.mean_batch.mean()), **v,
                        **{f"{d}_vs_best": v[d] / best for d in ("threshold", "cost", "auto")}})
        return {"axis": axes[1], "modes": modes, "points": out,
                "worst_vs_best": {d: min(x[f"{d}_vs_best"] for x in out) for d in ("threshold", "cost", "auto")},
                "min_speedup": {d: min(x[d] for x in out) for d in modes},
                "points_below_token": {d: sum(x[d] < 0.995 for x in out) for d in modes}}
    if name == "msat":
        out = []
        prof_msat = int(get_profile(spec.base.hardware.profile).m_sat)
        for lp, g in df.groupby("workload.prefix_len"):
            best = g.loc[g.throughput_rps.idxmax()]
            at = g.iloc[(g["policy.m_sat"] - prof_msat).abs().argsort().iloc[0]]
            out.append({"L_p": int(lp), "best_m_sat": int(best["policy.m_sat"]),
                        "best_rps": float(best.throughput_rps), "profile_m_sat": prof_msat,
                        "nearest_grid_m_sat": int(at["policy.m_sat"]), "profile_m_sat_rps": float(at.throughput_rps),
                        "loss_at_profile_m_sat": float(1 - at.throughput_rps / best.throughput_rps)})
        return {"points": out}
    if name == "tenancy":
        out = []
        for (k, p), g in df.groupby(["workload.roles", "policy.name"]):
            f = g[g["scheduler.admission"] == "fcfs"].iloc[0]
            q = g[g["scheduler.admission"] == "prefix"].iloc[0]
            out.append({"k": int(k), "policy": p, "fcfs_rps": float(f.throughput_rps),
                        "prefix_rps": float(q.throughput_rps), "fcfs_hit": float(f.prefix_hit_rate),
                        "prefix_hit": float(q.prefix_hit_rate)})
        return {"points": out}
    return {}


def _beyond_md(name: str, s: dict, folder: str) -> str:
    if name == "adaptive_hot":
        rows = "\n".join(f"| {x['k']} | {x['L_p']} | {x['best_static']} | {x['best_static_speedup']:.3f}x | "
                         f"{x['adaptive_speedup']:.3f}x | {x['adaptive_over_best']:.4f} | {x['adaptive_hot_end']} |"
                         for x in s["points"])
        return (f"**Adaptive HOT fraction** (`sweeps/adaptive_hot.toml`; table `{folder}/results.csv`, plot "
                f"`{folder}/*.png`): adaptive matches or beats the best static `hot_fraction` (0.05 … 0.6) at "
                f"**{s['matches_or_beats']} of {s['of']}** (k, L_p) points; worst shortfall "
                f"{s['worst_shortfall']:.2%}.\n\n| k | L_p | best static | its speedup | adaptive | adaptive / best "
                f"| HOT tokens at end |\n| --- | --- | --- | --- | --- | --- | --- |\n{rows}\n")
    if name in ("dispatch", "dispatch_tenancy"):
        modes = s["modes"]
        label = "max_running (mean batch)" if name == "dispatch" else "k (mean batch)"
        rows = "\n".join(f"| {x['L_p']} | {x['axis']} ({x['mean_batch']:.0f}) | "
                         + " | ".join(f"{x[d]:.3f}" for d in modes) + " |" for x in s["points"])
        what = ("one role, group size set by max_running" if name == "dispatch" else
                "k roles, default batch limits: many small groups")
        return (f"**Dispatch: cost model vs the M_sat threshold, {what}** (`sweeps/{name}.toml`; `{folder}/`): "
                f"speedup over token. Worst / best mode per point: "
                + ", ".join(f"{d} {v:.4f}" for d, v in s["worst_vs_best"].items())
                + "; lowest speedup over token: " + ", ".join(f"{d} {v:.3f}x" for d, v in s["min_speedup"].items())
                + "; points below token (< 0.995x): " + ", ".join(f"{d} {v}" for d, v in
                                                                  s["points_below_token"].items())
                + f".\n\n| L_p | {label} | " + " | ".join(modes) + " |\n| --- | --- | "
                + " | ".join("---" for _ in modes) + f" |\n{rows}\n")
    if name == "msat":
        rows = "\n".join(f"| {x['L_p']} | {x['best_m_sat']} | {x['best_rps']:.3f} | {x['nearest_grid_m_sat']} | "
                         f"{x['profile_m_sat_rps']:.3f} | {x['loss_at_profile_m_sat']:.2%} |" for x in s["points"])
        pm = s["points"][0]["profile_m_sat"] if s["points"] else "?"
        return (f"**Throughput over M_sat** (`sweeps/msat.toml`, threshold dispatch, one role, batch ~600; "
                f"`{folder}/`; the profile's M_sat is {pm}):\n\n| L_p | best M_sat | its req/s | grid M_sat nearest "
                f"the profile's | its req/s | loss |\n| --- | --- | --- | --- | --- | --- |\n{rows}\n")
    if name == "tenancy":
        rows = "\n".join(f"| {x['k']} | {x['policy']} | {x['fcfs_rps']:.3f} | {x['prefix_rps']:.3f} | "
                         f"{x['prefix_rps'] / x['fcfs_rps']:.2f}x | {x['fcfs_hit']:.2f} → {x['prefix_hit']:.2f} |"
                         for x in s["points"])
        return (f"**Tenancy-aware admission** (`sweeps/tenancy.toml`; `{folder}/`): `scheduler.admission = "
                f"\"prefix\"` vs FCFS.\n\n| k | policy | FCFS req/s | prefix req/s | gain | hit rate |\n"
                f"| --- | --- | --- | --- | --- | --- |\n{rows}\n")
    return ""


def run_paper(out: Path, profiles: list[str], num_requests: int = 400, rate: float = 100.0,
              workers: int | None = None, ray: str | None = None, beyond: bool = True) -> dict:
    from granisim.sweepplots import write_plots

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    report: dict = {"command": f"granisim paper --out {out} --profiles {','.join(profiles)} "
                               f"--num-requests {num_requests}",
                    "commit": _git("rev-parse", "--short", "HEAD"), "date": time.strftime("%Y-%m-%d"),
                    "paper": PAPER, "num_requests": num_requests, "rate": rate, "profiles": {}}
    md = ["# The paper's claims in simulation\n",
          f"Generated by `{report['command']}` at commit {report['commit']} on {report['date']}. Every "
          f"\"ours\" figure is read from the results tables written next to this file "
          f"(`<profile>/results.csv`, one row per simulated point with its full scenario in "
          f"`<profile>/results/`); the paper's figures are quoted from {PAPER}.\n",
          f"Method: each point simulates {num_requests} requests arriving at {rate:g} req/s (far above "
          f"capacity: throughput = completed / makespan is the engine's maximum), Azure-trace suffix and "
          f"output lengths, seed 0; default scheduler (max_running 256, 8192 tokens per step, retract "
          f"preemption) and memory (mem_fraction 0.9, 4 GB reserve). \"token\" is SGLang's default (page "
          f"size 1), \"paged16\" vLLM's. The last column lists the cost-model terms (`t_*` in steps.parquet, "
          f"summed over the run) that moved most between the baseline and the target: where our ratio "
          f"differs from the paper's, that term, and the profile coefficient behind it, is the reason.\n"]
    for prof in profiles:
        spec = _spec(prof, num_requests, rate)
        df = run_sweep(spec, out / prof, workers=workers, ray_address=ray)
        df.drop(columns=["scenario"]).to_csv(out / prof / "results.csv", index=False)
        rows = claims(Results(spec, df))
        _plot(rows, out / f"{prof}.png", f"paper vs granisim on {prof}")
        kinds = [c.source.kind for c in get_profile(prof).coefficients.values()]
        measured = kinds.count("measured")
        status = (f"{kinds.count('published')} coefficients published (datasheets, papers, Vidur's A100 timings), "
                  f"{kinds.count('extrapolated')} extrapolated, {measured} measured by our calibration"
                  + (" — extrapolated today: these figures are predictions to check against the calibration run"
                     if measured == 0 else ""))
        report["profiles"][prof] = {"rows": rows, "measured_coefficients": measured, "points": len(spec.points)}
        md.append(f"## {prof}\n\nProfile `{prof}`: {status}. Key coefficients: {_coeffs(prof)}.\n\n"
                  + _md_table(rows) + f"\n\n![{prof}]({prof}.png)\n")
    report["beyond"] = {}
    root = Path(__file__).resolve().parent.parent / "sweeps"
    for prof in (profiles if beyond else []):
        md.append(f"## Beyond the paper ({prof})\n")
        report["beyond"][prof] = {}
        for name in BEYOND:
            path = root / f"{name}.toml"
            raw = _raw(path)
            spec = sweep_from_dict({**raw, "set": {**raw.get("set", {}), "hardware.profile": prof}}, str(path), path)
            folder = out / "beyond" / prof / name
            df = run_sweep(spec, folder, workers=workers, ray_address=ray)
            df.drop(columns=["scenario"]).to_csv(folder / "results.csv", index=False)
            write_plots(spec, df, folder)
            s = _beyond(name, df, spec)
            report["beyond"][prof][name] = s
            rel = folder.relative_to(out) if folder.is_relative_to(out) else folder
            md.append(_beyond_md(name, s, str(rel)))
            md.append("".join(f"![{p.name}]({rel}/{p.name})\n" for p in sorted(folder.glob("*.png"))) + "\n")
    report["wall_s"] = time.time() - t0
    (out / "paper.json").write_text(json.dumps(report, indent=2, default=_jsonable))
    (out / "README.md").write_text("\n".join(md))
    return report


def _raw(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    return str(x)


def paper_cli(args) -> int:
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    rep = run_paper(Path(args.out), profiles, num_requests=args.num_requests, workers=args.workers, ray=args.ray)
    for prof, d in rep["profiles"].items():
        print(f"\n{prof}:")
        for x in d["rows"]:
            print(f"  {x['claim'][:95]:<95} paper {x['paper']:>22}  ours {x['ours']:.2f}x")
    print(f"\nwrote {args.out}/README.md, paper.json, plots ({rep['wall_s']:.0f} s)")
    return 0
