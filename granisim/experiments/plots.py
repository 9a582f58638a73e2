"""Plots (matplotlib PNG) and the Chrome/Perfetto trace of a run (steps and requests)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter


METRIC_LABELS = {"throughput_rps": "throughput (req/s)", "output_tok_s": "output tokens/s", "speedup": "speedup (x)",
                 "mean_batch": "mean batch (requests)", "prefix_hit_rate": "prefix hit rate",
                 "preemptions": "preemptions", "completed": "completed requests", "rejected": "rejected requests"}
_LATENCY = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E", "queue": "queue"}


def metric_label(col: str) -> str:
    """An axis label for a summary metric: ``ttft_p99_s`` -> ``TTFT p99 (s)``, ``throughput_rps`` ->
    ``throughput (req/s)``; other names as they are."""
    head, _, rest = col.partition("_")
    if head in _LATENCY and rest.endswith("_s") and rest[:-2].startswith("p") and rest[1:-2].isdigit():
        return f"{_LATENCY[head]} {rest[:-2]} (s)"
    return METRIC_LABELS.get(col, col)


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


def legend_or_note(ax, note: str = "no completed requests", **legend) -> None:
    """``ax``'s legend, or ``note`` where it has no curve (an empty legend would only warn)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**legend)
    else:
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)


def cdf_panel(ax, curves, xlabel: str, fontsize: int) -> None:
    """CDFs of several (values, label) curves on a log x axis, with a legend."""
    for values, label in curves:
        plot_cdf(ax, values, label)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("CDF")
    legend_or_note(ax, fontsize=fontsize)


def latency_axis(ax, *arrays, which: str = "x") -> None:
    """A readable x axis for latencies: log scale when they span more than a decade, labelled in
    plain numbers at 1-2-5 steps (at decades only beyond three decades), no minor labels (they
    overlap); else linear with a few ticks. ``which``: the "x" or "y" axis."""
    v = np.concatenate([np.asarray(a, float).ravel() for a in arrays] or [np.array([])])
    v = v[np.isfinite(v) & (v > 0)]
    axis = ax.xaxis if which == "x" else ax.yaxis
    if v.size and v.max() / v.min() > 10:
        (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        subs = (1.0,) if v.max() / v.min() > 1e3 else (1.0, 2.0, 5.0)
        axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
        axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        axis.set_minor_formatter(NullFormatter())
    else:
        axis.set_major_locator(MaxNLocator(6))


def plot_run(reqs: pd.DataFrame, steps: pd.DataFrame, out: Path, title: str = "") -> None:
    done = reqs[reqs.status == "completed"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, col, name in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "E2E")):
        plot_cdf(ax, done[col].to_numpy(), name)
        latency_axis(ax, done[col].to_numpy())
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("fraction of completed requests")
        ax.grid(alpha=0.3)
    left = len(reqs) - len(done)
    fig.suptitle(f"Latency CDFs of the {len(done)} completed requests"
                 + (f" (of {len(reqs)}; {left} not completed are not shown)" if left else "") + f" — {title}")
    save_figure(fig, out / "latency_cdf.png")

    t = steps.start_s.to_numpy()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    for col in [c for c in steps.columns if c.endswith("_used") or c.endswith("_cached")]:
        a1.plot(t, steps[col], label=col, lw=0.8)
    a1.set_ylabel("KV tokens")
    legend_or_note(a1, "no steps ran", loc="upper right", fontsize=8)
    a1.set_title(f"Pool occupancy — {title}")
    a2.plot(t, steps.batch, lw=0.8, label="requests in step")
    a2.plot(t, steps.decode_requests, lw=0.8, label="decoding")
    a2.set_ylabel("batch size")
    a2.set_xlabel("time (s)")
    a2.legend(loc="upper right", fontsize=8)
    save_figure(fig, out / "occupancy_batch.png")


STEP_TID, PARTS_TID = 1, 2  # the step threads of each replica's process


def _replicas(frame: pd.DataFrame | None) -> np.ndarray:
    if frame is None or not len(frame):
        return np.zeros(0, int)
    return frame["replica"].to_numpy(int) if "replica" in frame.columns else np.zeros(len(frame), int)


def _meta(kind: str, pid: int, name: str, tid: int | None = None, sort: int | None = None) -> list[dict]:
    ev = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name}}
    if tid is not None:
        ev["tid"] = tid
    out = [ev]
    if sort is not None:
        key = "thread_sort_index" if tid is not None else "process_sort_index"
        out.append({"name": key, "ph": "M", "pid": pid, **({"tid": tid} if tid is not None else {}),
                    "args": {"sort_index": sort}})
    return out


def _finite(x) -> bool:
    return x is not None and x == x and abs(x) != float("inf")


def request_events(reqs: pd.DataFrame, pid_of) -> list[dict]:
    """One async track per request (category ``request``, id = rid) in its replica's process: a
    ``request N`` slice from arrival to finish holding ``queue`` (arrival to admission), ``prefill``
    (admission to first token) and ``decode`` (first token to finish). A preempted request's
    re-queue and re-prefill fall inside its ``decode`` slice (the frame keeps first admission and
    first token only). A request that did not complete is one instant at arrival, named by its status."""
    events = []
    reps = _replicas(reqs)
    for row, rep in zip(reqs.itertuples(index=False), reps):
        pid, rid = pid_of(int(rep)), int(row.rid)
        t0 = row.arrival_s * 1e6
        base = dict(cat="request", id=rid, pid=pid, tid=0)
        info = dict(rid=rid, role=int(row.role), prompt_len=int(row.prompt_len), output_len=int(row.output_len),
                    cached_tokens=int(row.cached_tokens), preemptions=int(row.preemptions), status=row.status)
        if row.status != "completed" or not _finite(row.finish_s):
            reason = f" ({row.reason})" if getattr(row, "reason", "") else ""
            events.append(dict(name=f"request {rid} {row.status}{reason}", ph="n", ts=t0, args=info, **base))
            continue
        admit = (row.arrival_s + row.queue_s) * 1e6 if _finite(row.queue_s) else t0
        first = (row.arrival_s + row.ttft_s) * 1e6 if _finite(row.ttft_s) else admit
        end = row.finish_s * 1e6
        events.append(dict(name=f"request {rid}", ph="b", ts=t0, args=info, **base))
        for name, a, b in (("queue", t0, admit), ("prefill", admit, first), ("decode", first, end)):
            events.append(dict(name=name, ph="b", ts=a, **base))
            events.append(dict(name=name, ph="e", ts=max(a, b), **base))
        events.append(dict(name=f"request {rid}", ph="e", ts=end, **base))
    return events


def perfetto_trace(steps: pd.DataFrame, path: Path, requests: pd.DataFrame | None = None) -> None:
    """Chrome trace-event JSON (open in ui.perfetto.dev). One process per replica (``replica``
    column of the frames; one replica when absent) with named threads: ``steps`` (one slice per
    plan) and ``cost breakdown`` (its priced parts, stacked in order); and, from ``requests``, one
    async track per request (:func:`request_events`)."""
    keys = [c for c in steps.columns if c.startswith("t_")]
    reps = sorted(set(_replicas(steps).tolist()) | set(_replicas(requests).tolist())) or [0]
    single = reps == [0]

    def pid_of(rep: int) -> int:
        return rep + 1

    events = []
    for rep in reps:
        pid = pid_of(rep)
        events += _meta("process_name", pid, "engine" if single else f"replica {rep}", sort=pid)
        events += _meta("thread_name", pid, "steps", STEP_TID, sort=STEP_TID)
        events += _meta("thread_name", pid, "cost breakdown", PARTS_TID, sort=PARTS_TID)
    for row, rep in zip(steps.itertuples(index=False), _replicas(steps)):
        pid = pid_of(int(rep))
        ts = row.start_s * 1e6
        args = dict(batch=row.batch, prefill_tokens=row.prefill_tokens, steps=row.num_steps,
                    dense=row.groups_dense, cascade=row.groups_cascade)
        events.append(dict(name=f"step {row.step}", ph="X", ts=ts, dur=row.duration_s * 1e6, pid=pid, tid=STEP_TID,
                           args=args))
        cursor = ts
        for k in keys:
            d = getattr(row, k) * 1e6
            if d > 0:
                events.append(dict(name=k[2:], ph="X", ts=cursor, dur=d, pid=pid, tid=PARTS_TID))
                cursor += d
    if requests is not None:
        events += request_events(requests, pid_of)
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
    for ax, lab, col in ((axes[1], "TTFT (s)", "ttft_s"), (axes[2], "TPOT (s)", "tpot_s")):
        latency_axis(ax, *[reqs[n].loc[reqs[n].status == "completed", col].to_numpy() for n in names])
        ax.set_xlabel(lab)
        ax.set_ylabel("fraction of completed requests")
        legend_or_note(ax)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, out / "compare.png")
