"""Per-step time series and per-request summaries (pandas), plus the summary table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from granisim.core.contract import BatchPlan, StepResult
from granisim.core.request import RequestRecord

BREAKDOWN_KEYS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write",
                  "kv_copy", "overhead")


STEP_COLS = ("step", "start_s", "duration_s", "num_steps", "batch", "prefill_tokens", "decode_requests",
             "groups_dense", "groups_cascade", "groups_paged", "copies", "hit_rate", "evictions")
_ZEROS = (0.0,) * len(BREAKDOWN_KEYS)


class StepLog:
    """Columnar log of executed plans (one row per plan; ``num_steps`` > 1 when fast-forwarded).

    A plan is recorded as one tuple (step columns, pool occupancy, breakdown); every ``CHUNK``
    rows are packed into one numpy array per column, so a long run keeps ~8 bytes per value."""

    CHUNK = 4096

    def __init__(self):
        self._rows: list[tuple] = []
        self._chunks: list[list[np.ndarray]] = []  # per packed chunk, one array per column
        self._pools: tuple[str, ...] | None = None  # the pools' names, in occupancy() order

    def __len__(self) -> int:
        return len(self._rows) + sum(c[0].size for c in self._chunks)

    def record(self, start: float, plan: BatchPlan, result: StepResult, allocator) -> None:
        prefill = [r.num_new for r in plan.requests if r.is_prefill]
        paths = [g.path for g in plan.groups]
        occ = allocator.occupancy()
        if self._pools is None:
            self._pools = tuple(occ)
        elif tuple(occ) != self._pools:
            raise ValueError(f"step {plan.step}: pools {tuple(occ)} differ from the log's {self._pools}")
        bd = result.breakdown
        self._rows.append((plan.step, start, result.duration_s, plan.num_steps, len(plan.requests), sum(prefill),
                           len(plan.requests) - len(prefill), paths.count("dense"), paths.count("cascade"),
                           paths.count("paged"), sum(x.length for x in plan.copies) if plan.copies else 0,
                           allocator.hit_rate, allocator.evictions, *(v for pair in occ.values() for v in pair),
                           *map(bd.get, BREAKDOWN_KEYS, _ZEROS)))
        if len(self._rows) >= self.CHUNK:
            self._pack()

    def _pack(self) -> None:
        self._chunks.append([np.array(col) for col in zip(*self._rows)])
        self._rows = []

    def _columns(self) -> list[str]:
        pools = [f"{n}_{what}" for n in self._pools for what in ("used", "cached")]
        return [*STEP_COLS, *pools, *(f"t_{k}" for k in BREAKDOWN_KEYS)]

    def frame(self) -> pd.DataFrame:
        if self._pools is None:  # nothing recorded
            return pd.DataFrame({**{k: [] for k in STEP_COLS}, **{f"t_{k}": [] for k in BREAKDOWN_KEYS}})
        if self._rows:
            self._pack()
        cols = [np.concatenate(parts) for parts in zip(*self._chunks)]
        return pd.DataFrame(dict(zip(self._columns(), cols)))


REQUEST_COLS = ("rid", "role", "session", "turn", "status", "reason", "arrival_s", "prompt_len", "output_len",
                "generated", "cached_tokens", "preemptions", "queue_s", "ttft_s", "tpot_s", "e2e_s", "finish_s")


def requests_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """One row per request, by rid (built column by column: no per-request dict)."""
    cols = {k: [getattr(r, k) for r in records] for k in REQUEST_COLS}
    return pd.DataFrame(cols).sort_values("rid", kind="stable").reset_index(drop=True)


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
