"""One call from a raw directory to a profile (and, optionally, the calibration report's figures):
what ``granisim calibrate fit RAW_DIR --out PROFILE.json`` runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from granisim.config.hardware import get_profile, load_profile
from granisim.config.models import get_model

from .fit import FitResult, fit
from .msat import best_threshold, measured_crossovers, model_crossovers, paired, plot
from .profile import profile_doc, write_profile
from .raw import Raw, load_raw

# Families and their targets (issue 5): held-out median <= 5%, p90 <= 15%.
TARGET_MEDIAN, TARGET_P90 = 0.05, 0.15
REPORT_FAMILIES = [("linear(table)", "linear operators (measured table, interpolated)"),
                   ("linear(roofline)", "linear operators (roofline form, for other GPUs)"),
                   ("linear.lm_head", "LM head (roofline)"),
                   ("decode", "decode / paged re-read"), ("cascade", "cascade prefix pass"),
                   ("dense", "dense prefix pass"), ("extend", "prefill / extend"), ("merge", "LSE merge"),
                   ("kv_write", "KV write"), ("kv_copy", "KV copy")]


@dataclass
class Calibration:
    raw: Raw
    result: FitResult
    doc: dict
    profile_path: Path
    msat: dict


def calibrate(raw_dir, out, *, name: str | None = None, start_profile: str = "h200", command: str | None = None,
              seed: int = 0, folds: int = 5, extra_table_dirs=(), progress: bool = False,
              workers: int | None = None) -> Calibration:
    raw = load_raw(raw_dir)
    base = {k: c.value for k, c in get_profile(start_profile).coefficients.items()}
    res = fit(raw, base, seed, folds, progress=progress, workers=workers)
    p = paired(raw.attention)
    per_L = measured_crossovers(p) if len(p) else {}
    T, excess = best_threshold(p) if len(p) else (int(res.values.get("m_sat", 1024)), {})
    res.values["m_sat"] = T
    res.notes["m_sat"] = ("measured: the one threshold (dense iff M_eff >= it) that minimises the summed relative "
                          "excess time over the better path on the measured dense/cascade slab pairs (G=4) at L_p = "
                          f"{', '.join(str(k) for k in per_L)}; per L_p, dense is no slower from M_eff = "
                          f"{', '.join(str(v['strict']) for v in per_L.values())} on (strict), best threshold per L_p "
                          f"{', '.join(str(v['best']) for v in per_L.values())}")
    name = name or str(raw.meta.get("gpu_flag") or "gpu")
    out = Path(out)
    command = command or (f"python -m calibration.measure --gpu {raw.meta.get('gpu_flag') or name} "
                          f"--model {raw.meta.get('model')} --out RAW; "
                          f"granisim calibrate fit RAW --out {out.name}")
    doc = profile_doc(raw, res, name=name, command=command, table_prefix=f"{name}_{raw.meta.get('model', 'model')}")
    path = write_profile(doc, raw, res, out, extra_table_dirs)
    prof = load_profile(path)  # validates what we wrote
    model = get_model(raw.meta.get("model", "llama-3.1-8b"))
    Ls = sorted(p["L"].unique()) if len(p) else []
    ms = {"per_L_measured": per_L, "overall": T, "excess": excess,
          "per_L_model": model_crossovers(prof, model, Ls), "paired": p}
    return Calibration(raw, res, doc, path, ms)


def error_table(res: FitResult) -> list[tuple]:
    rows = []
    for key, label in REPORT_FAMILIES:
        e = res.errors.get(key)
        if not e:
            continue
        h = e["heldout"]
        f = e.get("formula_heldout")
        ok = h["n"] and h["median"] <= TARGET_MEDIAN and h["p90"] <= TARGET_P90
        rows.append((key, label, h["n"], h["median"], h["p90"], f["median"] if f else None, f["p90"] if f else None,
                     "yes" if ok else "no"))
    return rows


def format_errors(res: FitResult) -> str:
    lines = [f"{'family':18s} {'n':>3s} {'median':>7s} {'p90':>7s}  {'formula med/p90':>16s}  target met"]
    for key, _, n, med, p90, fm, fp, ok in error_table(res):
        fs = f"{fm:6.1%}/{fp:6.1%}" if fm is not None else "       -      "
        lines.append(f"{key:18s} {n:3d} {med:7.1%} {p90:7.1%}  {fs:>16s}  {ok}")
    return "\n".join(lines)


def residual_plot(res: FitResult, out) -> Path:
    from granisim.experiments.plots import plt, save_figure  # report sets the Agg backend

    r = res.residuals
    if "censored" in r.columns:
        r = r[r["censored"].fillna(False).astype(bool) == False]  # noqa: E712 (host-bound samples)
    fams = [f for f in ["decode", "cascade", "dense", "extend", "merge", "kv_write", "qkv_proj", "o_proj", "mlp_up",
                        "mlp_down", "lm_head", "norm"] if f in set(r["family"])]
    n = len(fams)
    cols = 4
    rows_ = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows_, cols, figsize=(4 * cols, 3.3 * rows_))
    axes = np.atleast_1d(axes).ravel()
    for ax, fam in zip(axes, fams):
        g = r[r["family"] == fam]
        pred = g["table_s"].where(g["table_s"].notna(), g["pred_s"]) if "table_s" in g and fam in (
            "qkv_proj", "o_proj", "mlp_up", "mlp_down", "norm") else g["pred_s"]
        err = pred / g["meas_s"] - 1
        ax.semilogx(g["meas_s"][~g["heldout"]] * 1e6, err[~g["heldout"]] * 100, ".", color="0.5", label="train")
        ax.semilogx(g["meas_s"][g["heldout"]] * 1e6, err[g["heldout"]] * 100, "o", color="C3", mfc="none",
                    label="held out")
        if "formula_s" in g and g["formula_s"].notna().any():
            fe = g["formula_s"] / g["meas_s"] - 1
            ax.semilogx(g["meas_s"] * 1e6, fe * 100, "x", color="C0", ms=3, alpha=0.5, label="formula only")
        ax.axhline(0, color="k", lw=0.5)
        for y in (-15, -5, 5, 15):
            ax.axhline(y, color="0.8", lw=0.5, ls="--")
        ax.set_title(fam)
        ax.set_xlabel("measured (us)")
        ax.set_ylabel("predicted / measured - 1 (%)")
        ax.set_ylim(-60, 60)
    for ax in axes[n:]:
        ax.axis("off")
    axes[0].legend(fontsize=7)
    return save_figure(fig, out, dpi=100)


def write_figures(cal: Calibration, report_dir, name: str) -> dict:
    d = Path(report_dir)
    prof = load_profile(cal.profile_path)
    model = get_model(cal.raw.meta.get("model", "llama-3.1-8b"))
    figs = {"msat": plot(cal.msat["paired"], prof, model, cal.msat["overall"], cal.msat["per_L_measured"],
                         d / f"{name}_msat.png", title=f"{cal.raw.meta.get('gpu', name)}: dense vs cascade prefix pass "
                                                      f"(Llama-3.1-8B layer, slab, G=4)"),
            "residuals": residual_plot(cal.result, d / f"{name}_residuals.png")}
    summary = {"errors": cal.result.errors, "m_sat": {k: v for k, v in cal.msat.items() if k != "paired"},
               "split_check": cal.result.split_check, "meta": cal.raw.meta}
    (d / f"{name}_fit.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return figs
