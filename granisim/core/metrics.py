"""Per-step time series and per-request summaries (pandas), plus the summary table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from granisim.core.contract import BatchPlan, StepResult
from granisim.core.request import RequestRecord

BREAKDOWN_KEYS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write",
                  "kv_copy", "overhead")


class StepLog:
    """Columnar log of executed plans (one row per plan; ``num_steps`` > 1 when fast-forwarded)."""

    def __init__(self):
        self.cols: dict[str, list] = {k: [] for k in (
            "step", "start_s", "duration_s", "num_steps", "batch", "prefill_tokens", "decode_requests",
            "groups_dense", "groups_cascade", "groups_paged", "copies", "hit_rate", "evictions")}
        self.pool_cols: dict[str, list] = {}
        self.breakdown: dict[str, list] = {k: [] for k in BREAKDOWN_KEYS}

    def record(self, start: float, plan: BatchPlan, result: StepResult, allocator) -> None:
        c = self.cols
        prefill = sum(r.num_new for r in plan.requests if r.is_prefill)
        paths = [g.path for g in plan.groups]
        c["step"].append(plan.step)
        c["start_s"].append(start)
        c["duration_s"].append(result.duration_s)
        c["num_steps"].append(plan.num_steps)
        c["batch"].append(len(plan.requests))
        c["prefill_tokens"].append(prefill)
        c["decode_requests"].append(len(plan.requests) - sum(r.is_prefill for r in plan.requests))
        c["groups_dense"].append(paths.count("dense"))
        c["groups_cascade"].append(paths.count("cascade"))
        c["groups_paged"].append(paths.count("paged"))
        c["copies"].append(sum(x.length for x in plan.copies))
        c["hit_rate"].append(allocator.hit_rate)
        c["evictions"].append(allocator.evictions)
        for name, (used, cached) in allocator.occupancy().items():
            self.pool_cols.setdefault(f"{name}_used", []).append(used)
            self.pool_cols.setdefault(f"{name}_cached", []).append(cached)
        for k in BREAKDOWN_KEYS:
            self.breakdown[k].append(result.breakdown.get(k, 0.0))

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.cols)
        for k, v in self.pool_cols.items():
            df[k] = v
        for k, v in self.breakdown.items():
            df[f"t_{k}"] = v
        return df


def requests_frame(records: list[RequestRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        rows.append(dict(rid=r.rid, role=r.role, session=r.session, turn=r.turn, status=r.status,
                         reason=r.reason, arrival_s=r.arrival_s, prompt_len=r.prompt_len,
                         output_len=r.output_len, generated=r.generated, cached_tokens=r.cached_tokens, preemptions=r.preemptions,
                         queue_s=r.queue_s, ttft_s=r.ttft_s, tpot_s=r.tpot_s, e2e_s=r.e2e_s,
                         finish_s=r.finish_s))
    return pd.DataFrame(rows).sort_values("rid", kind="stable").reset_index(drop=True)


def summarize(reqs: pd.DataFrame, steps: pd.DataFrame, end_s: float) -> dict:
    done = reqs[reqs.status == "completed"]
    first = reqs.arrival_s.min() if len(reqs) else 0.0
    span = max(end_s - first, 1e-12)

    def pct(col, q):
        v = done[col].dropna()
        return float(np.percentile(v, q)) if len(v) else float("nan")

    total_steps = int(steps.num_steps.sum()) if len(steps) else 0
    path_rows = steps[["groups_dense", "groups_cascade", "groups_paged"]].mul(steps.num_steps, axis=0).sum() \
        if len(steps) else None
    return {
        "requests": int(len(reqs)),
        "completed": int(len(done)),
        "rejected": int((reqs.status == "rejected").sum()),
        "duration_s": float(span),
        "throughput_rps": float(len(done) / span),
        "output_tok_s": float(done.output_len.sum() / span),
        "ttft_p50_s": pct("ttft_s", 50), "ttft_p99_s": pct("ttft_s", 99),
        "tpot_p50_s": pct("tpot_s", 50), "tpot_p99_s": pct("tpot_s", 99),
        "e2e_p50_s": pct("e2e_s", 50), "e2e_p99_s": pct("e2e_s", 99),
        "queue_p50_s": pct("queue_s", 50),
        "preemptions": int(reqs.preemptions.sum()),
        "prefix_hit_rate": float(steps.hit_rate.iloc[-1]) if len(steps) else 0.0,
        "steps": total_steps,
        "plans": int(len(steps)),
        "mean_batch": float(np.average(steps.batch, weights=steps.num_steps)) if len(steps) else 0.0,
        "dense_groups": int(path_rows["groups_dense"]) if path_rows is not None else 0,
        "cascade_groups": int(path_rows["groups_cascade"]) if path_rows is not None else 0,
        "evictions": int(steps.evictions.iloc[-1]) if len(steps) else 0,
    }
