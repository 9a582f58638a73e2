"""Speedup columns and plots (heatmaps, lines) of a sweep's results table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.experiments.plots import metric_label, plt, save_figure
from granisim.experiments.sweep_file import PlotSpec, Speedup, SweepSpec


def add_speedup(df: pd.DataFrame, sp: Speedup, varied: list[str]) -> pd.DataFrame:
    """Rows of ``sp.target`` with ``speedup`` = metric / the matching ``sp.baseline`` row's metric.

    A baseline row matches on every varied field that all baseline rows override (so a
    baseline swept over fewer fields, e.g. ``token`` without ``hot_fraction``, serves every
    target row that shares its values) and on every field the baseline rows differ in (baselines
    from several ``[[grid]]`` tables are told apart, not averaged)."""
    if df.empty or sp.field not in df.columns:
        return df.iloc[0:0]
    tgt = df[df[sp.field].astype(str) == str(sp.target)].copy()
    base = df[df[sp.field].astype(str) == str(sp.baseline)]
    if base.empty or tgt.empty:
        tgt["speedup"] = np.nan
        return tgt
    base_keys = set.intersection(*(set(json.loads(o)) for o in base.overrides))
    keys = [k for k in varied if k != sp.field and k in df.columns
            and (k in base_keys or base[k].astype(str).nunique() > 1)]
    ref = base.groupby(keys, dropna=False)[sp.metric].mean() if keys else base[sp.metric].mean()
    if keys:
        idx = pd.MultiIndex.from_frame(tgt[keys]) if len(keys) > 1 else pd.Index(tgt[keys[0]])
        tgt["baseline_" + sp.metric] = ref.reindex(idx).to_numpy()
    else:
        tgt["baseline_" + sp.metric] = ref
    tgt["speedup"] = tgt[sp.metric] / tgt["baseline_" + sp.metric]
    return tgt


def default_plots(spec: SweepSpec) -> list[PlotSpec]:
    axes = [v for v in spec.varied if not (spec.speedup and v == spec.speedup.field)]
    value = "speedup" if spec.speedup else "throughput_rps"
    if len(axes) >= 2:
        return [PlotSpec("heatmap", axes[0], axes[1], value)]
    if axes:
        return [PlotSpec("line", axes[0], None, value)]
    return []


def _label(x) -> str:
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


def _sorted_values(s: pd.Series) -> list:
    vals = list(pd.unique(s))
    try:
        return sorted(vals)
    except TypeError:  # mixed numbers and text ('adaptive'): numbers first
        return sorted(vals, key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0, str(v)))


def plot(df: pd.DataFrame, p: PlotSpec, path: Path, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7, 5))
    if p.kind == "heatmap":
        xs, ys = _sorted_values(df[p.x]), _sorted_values(df[p.y])
        grid = np.full((len(ys), len(xs)), np.nan)
        for (xv, yv), v in df.groupby([p.x, p.y])[p.value].mean().items():
            grid[ys.index(yv), xs.index(xv)] = v
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(xs)), [_label(v) for v in xs])
        ax.set_yticks(range(len(ys)), [_label(v) for v in ys])
        for i in range(len(ys)):
            for j in range(len(xs)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=10,
                            color="white" if grid[i, j] < np.nanmean(grid) else "black")
        fig.colorbar(im, ax=ax, label=metric_label(p.value))
        ax.set_ylabel(p.y)
    else:
        by = p.y or ("policy.name" if "policy.name" in df.columns and df["policy.name"].nunique() > 1 else None)
        by = by.split(",") if by else None  # one line per value (combination) of these fields
        groups = df.groupby(by) if by else [((), df)]
        for name, g in groups:
            g = g.groupby(p.x)[p.value].mean()
            xs = _sorted_values(pd.Series(g.index))
            name = name if isinstance(name, tuple) else (name,)
            ax.plot([_label(x) if isinstance(x, str) else x for x in xs], [g[x] for x in xs], marker="o",
                    label=", ".join(f"{b}={_label(v)}" for b, v in zip(by, name)) if by else None)
        if by:
            ax.legend(fontsize=8)
        ax.set_ylabel(metric_label(p.value))
        ax.grid(alpha=0.3)
    ax.set_xlabel(p.x)
    ax.set_title(p.title or title or f"{p.value} over {p.x}" + (f" x {p.y}" if p.y else ""))
    save_figure(fig, path)
    return path


def write_plots(spec: SweepSpec, df: pd.DataFrame, out: Path) -> list[Path]:
    """Speedup table (``speedup.csv``) and every plot of ``spec`` (or the default ones)."""
    out = Path(out)
    paths = []
    sp_df = None
    if spec.speedup is not None:
        sp_df = add_speedup(df, spec.speedup, spec.varied)
        cols = [c for c in spec.varied if c in sp_df.columns] + [spec.speedup.metric,
                                                                 "baseline_" + spec.speedup.metric, "speedup"]
        sp_df[[c for c in cols if c in sp_df.columns]].to_csv(out / "speedup.csv", index=False)
        paths.append(out / "speedup.csv")
    for i, p in enumerate(spec.plots or default_plots(spec)):
        data = sp_df if p.value == "speedup" else df
        for k, v in (p.where or {}).items():
            if data is not None and k in data.columns:
                data = data[data[k].astype(str) == str(v)]
        if data is None or data.empty or p.value not in data.columns:
            continue
        name = f"{p.kind}_{p.value}_{p.x}" + (f"_{p.y}" if p.y else "") + \
            "".join(f"_{k}={v}" for k, v in (p.where or {}).items())
        name = name.replace(".", "-").replace(",", "+").replace("/", "-")
        paths.append(plot(data, p, out / f"{name}.png", f"{spec.name}: {p.value}"))
    return paths
