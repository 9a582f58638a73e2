"""A fleet run's frames, summaries and table.

* requests: one row per request (the single-GPU columns) + ``replica`` (where it finished,
  -1 if rejected at the router) and ``rerouted`` (times a failing replica handed it back).
* steps: one row per executed plan of every replica, by start time, + ``replica`` and
  ``incarnation`` (a replica that came back after a fault starts a new one).
* summary: the fleet's figures (as a single run's) + router, re-routed / recomputed counts
  and a ``replicas`` list with each replica's own figures.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from granisim.core.metrics import requests_frame, summarize, summary_json
from granisim.core.request import NOT_SENT


def fleet_requests(result) -> pd.DataFrame:
    recs = result.records
    reqs = requests_frame(recs.requests)
    rids = recs.requests.columns()["rid"].tolist() if len(recs) else []
    where = dict(zip(rids, recs.replicas().tolist()))  # a rid's last record's replica
    reqs.insert(1, "replica", reqs.rid.map(where).astype("int64"))
    reqs.insert(2, "rerouted", reqs.rid.map(lambda rid: result.rerouted.get(rid, 0)).astype("int64"))
    return reqs


def fleet_steps(result) -> pd.DataFrame:
    frames = []
    for rep in result.replicas:
        f = rep.steps_frame()
        f.insert(0, "replica", rep.index)
        frames.append(f)
    if not any(len(f) for f in frames):  # no step anywhere: the columns alone
        return frames[0]
    steps = pd.concat([f for f in frames if len(f)], ignore_index=True)
    return steps.sort_values(["start_s", "replica"], kind="stable").reset_index(drop=True)


def _replica_summary(rep, reqs: pd.DataFrame, steps: pd.DataFrame, end_s: float) -> dict:
    mine = reqs[reqs.replica == rep.index]
    own = steps[steps.replica == rep.index]
    s = summarize(mine, own, end_s)
    t = rep.totals
    setup = rep.spec.setup
    s.update(replica=rep.index, group=rep.spec.group, tp=rep.spec.tp, policy=setup.scenario.policy.name,
             profile=setup.profile.name, kv_budget_tokens=setup.kv_budget, incarnations=t["incarnations"],
             down_s=rep.down_s, preemptions=t["preemptions"], evictions=t["evictions"],
             prefix_hit_rate=t["hit_tokens"] / t["lookup_tokens"] if t["lookup_tokens"] else 0.0)
    return s


def fleet_summary(result, reqs: pd.DataFrame, steps: pd.DataFrame) -> dict:
    summary = summarize(reqs, steps, result.end_s)
    per = [_replica_summary(rep, reqs, steps, result.end_s) for rep in result.replicas]
    hit = sum(r.totals["hit_tokens"] for r in result.replicas)
    looked = sum(r.totals["lookup_tokens"] for r in result.replicas)
    summary.update(router=result.router, num_replicas=len(result.replicas),
                   gpus=sum(r.spec.tp for r in result.replicas),
                   prefix_hit_rate=hit / looked if looked else 0.0,
                   evictions=sum(r.totals["evictions"] for r in result.replicas),
                   preemptions=sum(r.totals["preemptions"] for r in result.replicas),
                   rerouted=int(sum(result.rerouted.values())), rerouted_requests=len(result.rerouted),
                   recomputed=int(result.recomputed),
                   router_rejected=int(((reqs.replica < 0) & ~reqs.reason.str.startswith(NOT_SENT)).sum()),
                   replicas=per)
    return summary


def write_fleet_outputs(result, out: Path, meta: dict | None = None, plots: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    reqs, steps = fleet_requests(result), fleet_steps(result)
    summary = fleet_summary(result, reqs, steps)
    summary.update(meta or {})
    reqs.to_parquet(out / "requests.parquet", index=False)
    steps.to_parquet(out / "steps.parquet", index=False)
    (out / "summary.json").write_text(summary_json(summary))
    if plots:
        from granisim.fleet.plots import fleet_trace, plot_fleet

        plot_fleet(reqs, steps, out, title=f"{meta.get('scenario', 'fleet') if meta else 'fleet'} ({result.router})")
        fleet_trace(steps, out / "trace.json")
    return summary


COLS = [("requests", "reqs", "{}"), ("completed", "done", "{}"), ("rejected", "rej", "{}"),
        ("throughput_rps", "req/s", "{:.3f}"), ("ttft_p50_s", "TTFT p50", "{:.3f}"),
        ("ttft_p99_s", "TTFT p99", "{:.3f}"), ("tpot_p50_s", "TPOT p50", "{:.4f}"),
        ("tpot_p99_s", "TPOT p99", "{:.4f}"), ("prefix_hit_rate", "hit", "{:.2f}"),
        ("preemptions", "preempt", "{}"), ("mean_batch", "batch", "{:.1f}")]


def _row(name: str, s: dict) -> str:
    return f"{name:<14}" + "".join(f"{fmt.format(s[k]):>10}" for k, _, fmt in COLS)


def fleet_table(summary: dict) -> str:
    """One row per replica and the fleet's row, then the router's counts."""
    head = f"{'replica':<14}" + "".join(f"{h:>10}" for _, h, _ in COLS)
    lines = [head, "-" * len(head)]
    for r in summary["replicas"]:
        lines.append(_row(f"{r['replica']} {r['policy']}", r))
    lines.append("-" * len(head))
    lines.append(_row(f"fleet ({summary['num_replicas']})", summary))
    lines.append(f"router {summary['router']}: {summary['rerouted']} hand-backs of {summary['rerouted_requests']} "
                 f"requests from failing replicas, {summary['recomputed']} recomputed, "
                 f"{summary['router_rejected']} rejected with no replica up")
    return "\n".join(lines)


def routers_table(rows: dict[str, dict]) -> str:
    """One row per router (fleet figures), throughput relative to the first."""
    head = f"{'router':<14}" + "".join(f"{h:>10}" for _, h, _ in COLS) + f"{'vs first':>10}"
    lines = [head, "-" * len(head)]
    base = next(iter(rows.values()))["throughput_rps"] if rows else 0
    for name, s in rows.items():
        ratio = f"{s['throughput_rps'] / base:.2f}x" if base else "-"
        lines.append(_row(name, s) + f"{ratio:>10}")
    return "\n".join(lines)
