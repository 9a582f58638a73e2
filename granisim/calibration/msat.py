"""M_sat: the smallest M_eff at which the dense prefix pass beats cascade, measured and modelled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from granisim.costmodel import cost_tables, m_sat_threshold
from granisim.config.hardware import HardwareProfile
from granisim.config.models import ModelShape

A100_M_SAT = 1024  # the paper's A100 value (arXiv 2608.15584)


def paired(att: pd.DataFrame, G: int = 4) -> pd.DataFrame:
    """Dense and cascade over a slab at the same (L, M_eff): columns L, M_eff, dense_us, cascade_us, ratio."""
    a = att[(att["storage"] == "slab") & (att["G"] == G) & att["family"].isin(["dense", "cascade"])]
    p = a.pivot_table(index=["L", "M_eff"], columns="family", values="median_us").dropna().reset_index()
    p = p.rename(columns={"dense": "dense_us", "cascade": "cascade_us"})
    p["ratio"] = p["dense_us"] / p["cascade_us"]
    return p.sort_values(["L", "M_eff"]).reset_index(drop=True)


def measured_crossovers(p: pd.DataFrame) -> dict:
    """Per L: 'strict' = smallest measured M_eff from which dense is no slower at every larger measured
    M_eff (None if the largest loses); 'first' = smallest M_eff at which dense is no slower; 'best' =
    the threshold with the least summed relative excess at this L (:func:`best_threshold`)."""
    out = {}
    for L, g in p.groupby("L"):
        g = g.sort_values("M_eff")
        win = (g["ratio"] <= 1.0).to_numpy()
        m = g["M_eff"].to_numpy()
        strict = None
        if win[-1]:
            i = len(win) - 1
            while i > 0 and win[i - 1]:
                i -= 1
            strict = int(m[i])
        first = int(m[np.argmax(win)]) if win.any() else None
        out[int(L)] = {"strict": strict, "first": first, "best": best_threshold(g)[0]}
    return out


def best_threshold(p: pd.DataFrame) -> tuple[int, dict]:
    """The one threshold T (dense iff M_eff >= T) over all measured L minimising the summed relative
    excess time over the better path; returns (T, {T: excess})."""
    cands = np.unique(p["M_eff"].to_numpy())
    best = np.minimum(p["dense_us"], p["cascade_us"]).to_numpy()
    excess = {}
    for T in cands:
        chosen = np.where(p["M_eff"] >= T, p["dense_us"], p["cascade_us"])
        excess[int(T)] = float(np.sum(chosen / best - 1.0))
    T = min(excess, key=lambda k: (round(excess[k], 9), k))
    return T, excess


def model_crossovers(profile: HardwareProfile, model: ModelShape, Ls) -> dict:
    return {int(L): m_sat_threshold(profile, model, int(L)) for L in Ls}


def plot(p: pd.DataFrame, profile: HardwareProfile, model: ModelShape, m_sat: int, per_L: dict, out: str | Path,
         title: str = "") -> Path:
    from granisim.experiments.plots import plt, save_figure  # report sets the Agg backend

    Ls = sorted(p["L"].unique())
    fig, axes = plt.subplots(1, len(Ls), figsize=(4.2 * len(Ls), 3.8), sharey=False)
    axes = np.atleast_1d(axes)
    t = cost_tables(profile, model)
    m = np.unique(np.round(np.geomspace(4, 4096, 200) / t.G) * t.G)
    m = m[m >= t.G]
    for ax, L in zip(axes, Ls):
        g = p[p["L"] == L]
        ax.loglog(g["M_eff"], g["cascade_us"], "o", color="C0", label="cascade (measured)")
        ax.loglog(g["M_eff"], g["dense_us"], "s", color="C3", label="dense (measured)")
        per_layer = model.num_layers
        ax.loglog(m, t.prefix_time_array("cascade", int(L), m) / per_layer * 1e6, "-", color="C0", alpha=0.6,
                  label="cascade (profile)")
        ax.loglog(m, t.prefix_time_array("dense", int(L), m) / per_layer * 1e6, "-", color="C3", alpha=0.6,
                  label="dense (profile)")
        ax.axvline(m_sat, color="k", ls="--", lw=1, label=f"fitted M_sat = {m_sat}")
        c = per_L.get(int(L), {}).get("best")
        if c:
            ax.axvline(c, color="C2", ls=":", lw=1.5, label=f"best threshold at this L = {c}")
        ax.axvline(1024, color="0.6", ls="-.", lw=1, label="A100 (paper) 1024")
        ax.set_title(f"L_p = {int(L)}")
        ax.set_xlabel("M_eff = B x G")
        ax.grid(True, which="both", alpha=0.2)
    axes[0].set_ylabel("one layer's prefix pass (us)")
    axes[-1].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title)
    return save_figure(fig, out)
