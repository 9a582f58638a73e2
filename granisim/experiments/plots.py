"""Plots (matplotlib PNG) and the Chrome/Perfetto trace of steps."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def save_figure(fig, path, dpi: int = 110) -> Path:
    """Lay out, write (making the folder) and close a figure; returns its path."""
    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_cdf(ax, values, label):
    v = np.sort(np.asarray(values, float)[~np.isnan(values)])
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)


def plot_run(reqs: pd.DataFrame, steps: pd.DataFrame, out: Path, title: str = "") -> None:
    done = reqs[reqs.status == "completed"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, col, name in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "E2E")):
        plot_cdf(ax, done[col].to_numpy(), name)
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Latency CDFs — {title}")
    save_figure(fig, out / "latency_cdf.png")

    t = steps.start_s.to_numpy()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    for col in [c for c in steps.columns if c.endswith("_used") or c.endswith("_cached")]:
        a1.plot(t, steps[col], label=col, lw=0.8)
    a1.set_ylabel("KV tokens")
    a1.legend(loc="upper right", fontsize=8)
    a1.set_title(f"Pool occupancy — {title}")
    a2.plot(t, steps.batch, lw=0.8, label="requests in step")
    a2.plot(t, steps.decode_requests, lw=0.8, label="decoding")
    a2.set_ylabel("batch size")
    a2.set_xlabel("time (s)")
    a2.legend(loc="upper right", fontsize=8)
    save_figure(fig, out / "occupancy_batch.png")


def perfetto_trace(steps: pd.DataFrame, path: Path) -> None:
    """Chrome trace-event JSON (open in ui.perfetto.dev): one slice per plan, its parts stacked."""
    keys = [c for c in steps.columns if c.startswith("t_")]
    events = []
    for row in steps.itertuples(index=False):
        ts = row.start_s * 1e6
        args = dict(batch=row.batch, prefill_tokens=row.prefill_tokens, steps=row.num_steps,
                    dense=row.groups_dense, cascade=row.groups_cascade)
        events.append(dict(name=f"step {row.step}", ph="X", ts=ts, dur=row.duration_s * 1e6, pid=1, tid=1,
                           args=args))
        cursor = ts
        for k in keys:
            d = getattr(row, k) * 1e6
            if d > 0:
                events.append(dict(name=k[2:], ph="X", ts=cursor, dur=d, pid=1, tid=2))
                cursor += d
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


def plot_compare(summaries: dict[str, dict], reqs: dict[str, pd.DataFrame], out: Path, title: str = "") -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    names = list(summaries)
    axes[0].bar(names, [summaries[n]["throughput_rps"] for n in names])
    axes[0].set_ylabel("throughput (req/s)")
    for n in names:
        done = reqs[n][reqs[n].status == "completed"]
        plot_cdf(axes[1], done.ttft_s.to_numpy(), n)
        plot_cdf(axes[2], done.tpot_s.to_numpy(), n)
    for ax, lab in ((axes[1], "TTFT (s)"), (axes[2], "TPOT (s)")):
        ax.set_xscale("log")
        ax.set_xlabel(lab)
        ax.set_ylabel("CDF")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, out / "compare.png")
