"""Per-replica plots over time (load, prefix hit rate, HOT occupancy) and a Perfetto trace with
one process per replica."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from granisim.experiments.plots import cdf_panel, legend_or_note, plt, save_figure


def plot_fleet(reqs: pd.DataFrame, steps: pd.DataFrame, out: Path, title: str = "") -> Path:
    fig, axes = plt.subplots(4, 1, figsize=(12, 11), sharex=True)
    for rid, g in steps.groupby("replica", sort=True):
        t = g.start_s.to_numpy()
        axes[0].plot(t, g.batch, lw=0.7, label=f"replica {rid}")
        axes[1].plot(t, g.hit_rate, lw=0.8, label=f"replica {rid}")
        if "hot_used" in g:
            axes[2].plot(t, (g.hot_used + g.hot_cached).fillna(0), lw=0.8, label=f"replica {rid}")
    done = reqs[reqs.status == "completed"]
    for rid, g in done.groupby("replica", sort=True):
        axes[3].plot(g.finish_s.sort_values().to_numpy(), range(1, len(g) + 1), lw=0.8, label=f"replica {rid}")
    for ax, lab in zip(axes, ("requests in step", "prefix hit rate (cumulative)", "HOT tokens held",
                              "requests finished")):
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
    legend_or_note(axes[0], "no steps", loc="upper right", fontsize=7, ncol=4)
    axes[-1].set_xlabel("time (s)")
    axes[0].set_title(f"Per replica — {title}")
    path = save_figure(fig, out / "replicas.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    cdf_panel(ax, [(g.ttft_s.to_numpy(), f"replica {rid}") for rid, g in done.groupby("replica", sort=True)],
              "TTFT (s)", fontsize=7)
    save_figure(fig, out / "ttft_by_replica.png")
    return path


def fleet_trace(steps: pd.DataFrame, path: Path) -> None:
    """Chrome trace-event JSON (ui.perfetto.dev): process = replica, tracks 'steps' and 'parts'."""
    keys = [c for c in steps.columns if c.startswith("t_")]
    events = []
    for rid in sorted(steps.replica.unique()):
        pid = int(rid) + 1
        events.append(dict(name="process_name", ph="M", pid=pid, args=dict(name=f"replica {rid}")))
        events.append(dict(name="thread_name", ph="M", pid=pid, tid=1, args=dict(name="steps")))
        events.append(dict(name="thread_name", ph="M", pid=pid, tid=2, args=dict(name="parts")))
    for row in steps.itertuples(index=False):
        pid, ts = int(row.replica) + 1, row.start_s * 1e6
        events.append(dict(name=f"step {row.step}", ph="X", ts=ts, dur=row.duration_s * 1e6, pid=pid, tid=1,
                           args=dict(batch=row.batch, prefill_tokens=row.prefill_tokens, steps=row.num_steps)))
        cursor = ts
        for k in keys:
            d = getattr(row, k) * 1e6
            if d > 0:
                events.append(dict(name=k[2:], ph="X", ts=cursor, dur=d, pid=pid, tid=2))
                cursor += d
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
