"""Per-step time series and per-request summaries (pandas), plus the summary table."""

from __future__ import annotations

import json
import math
from itertools import compress

import numpy as np
import pandas as pd

from granisim.core.columns import PackedRows, pages
from granisim.core.contract import BatchPlan, StepResult
from granisim.core.planned import columns
from granisim.core.request import JoinedRecords, RequestRecord, RequestRecords

BREAKDOWN_KEYS = ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write",
                  "kv_copy", "overhead")


STEP_COLS = ("step", "start_s", "duration_s", "num_steps", "batch", "prefill_tokens", "decode_requests",
             "groups_dense", "groups_cascade", "groups_paged", "copies", "hit_rate", "evictions")


class StepLog:
    """Columnar log of executed plans (one row per plan; ``num_steps`` > 1 when fast-forwarded).

    A plan is recorded as one tuple (step columns, pool occupancy, breakdown), packed every
    ``CHUNK`` rows into one array per column (:class:`granisim.core.columns.PackedRows`: ~8 bytes
    per value). ``frame()`` is a frame over those arrays, not a copy of them; each call returns a
    shallow copy of it (pandas copy-on-write: changing one changes no other)."""

    CHUNK = 1024

    def __init__(self):
        self._log: PackedRows | None = None
        self._pools: tuple[str, ...] | None = None  # the pools' names, in occupancy() order
        self._keys = BREAKDOWN_KEYS  # set at the first plan: + host_copy with a host tier (copies compute does not hide)
        self._zeros: tuple[float, ...] = ()
        self._stats_len = 0  # the length of allocator.step_row(): 2 + 2 per pool
        self._frame: pd.DataFrame | None = None  # over the first _framed rows
        self._framed = 0

    def __len__(self) -> int:
        return len(self._log) if self._log is not None else 0

    def record(self, start: float, plan: BatchPlan, result: StepResult, allocator) -> None:
        cols = columns(plan.requests)
        n = len(cols.rid)
        nd = getattr(cols, "n_decode", None)
        if nd is not None:  # decode rows first, then the prefill rows
            prefill_tokens, decode = sum(cols.num_new[nd:]) if nd != n else 0, nd
        else:
            prefill = list(compress(cols.num_new, cols.is_prefill)) if True in cols.is_prefill else []
            prefill_tokens, decode = sum(prefill), n - len(prefill)
        if plan.groups:
            paths = [g.path for g in plan.groups]
            dense, cascade, paged = paths.count("dense"), paths.count("cascade"), paths.count("paged")
        else:
            dense = cascade = paged = 0
        if self._pools is None:
            self._pools = tuple(allocator.occupancy())  # the pools of one allocator: the same every plan
            self._log = PackedRows(self.CHUNK)
            if getattr(allocator, "host_tier", None) is not None:
                self._keys = (*BREAKDOWN_KEYS, "host_copy")
            self._zeros = (0.0,) * len(self._keys)
            self._stats_len = 2 + 2 * len(self._pools)
        stats = allocator.step_row()
        if len(stats) != self._stats_len:
            raise ValueError(f"step {plan.step}: pools {tuple(allocator.occupancy())} differ from the log's "
                             f"{self._pools}")
        bd = result.breakdown
        self._log.append((plan.step, start, result.duration_s, plan.num_steps, n, prefill_tokens, decode, dense,
                          cascade, paged, sum(x.length for x in plan.copies) if plan.copies else 0,
                          *stats, *map(bd.get, self._keys, self._zeros)))

    def _columns(self) -> list[str]:
        pools = [f"{n}_{what}" for n in self._pools for what in ("used", "cached")]
        return [*STEP_COLS, *pools, *(f"t_{k}" for k in self._keys)]

    def frame(self) -> pd.DataFrame:
        if self._pools is None:  # nothing recorded
            return pd.DataFrame({**{k: [] for k in STEP_COLS}, **{f"t_{k}": [] for k in BREAKDOWN_KEYS}})
        if self._frame is None or self._framed != len(self._log):
            self._frame = None  # let go of the old frame's arrays before arrays() may grow new ones
            self._framed = len(self._log)
            self._frame = pd.DataFrame(dict(zip(self._columns(), self._log.arrays())), copy=False)
        return self._frame.copy(deep=False)


REQUEST_COLS = ("rid", "role", "session", "turn", "status", "reason", "arrival_s", "prompt_len", "output_len",
                "generated", "cached_tokens", "preemptions", "queue_s", "ttft_s", "tpot_s", "e2e_s", "finish_s")


def requests_frame(records: RequestRecords | JoinedRecords | list[RequestRecord]) -> pd.DataFrame:
    """One row per request, by rid (stable: records of one rid keep their order), built from the
    records' columns (:class:`RequestRecords` or :class:`JoinedRecords`; a list of records is put
    into one first): one array per column, the derived latencies computed on whole columns (the same
    float operations as :class:`RequestRecord`'s properties), and no per-request object."""
    if not isinstance(records, (RequestRecords, JoinedRecords)):
        records = RequestRecords(records)
    if not len(records):
        return pd.DataFrame({k: [] for k in REQUEST_COLS}).sort_values("rid", kind="stable").reset_index(drop=True)
    src = records.columns()
    order = np.argsort(src["rid"], kind="stable")
    n = order.size

    def out(dtype) -> np.ndarray:
        return pages(n, dtype)  # the frame's columns: their own pages, not holes in the C heap

    c = {k: np.take(v, order, out=out(v.dtype)) if v.dtype != object else v[order] for k, v in src.items()}
    del src  # nothing is left viewing the records' arrays
    arrival, first, finish, out_len = c["arrival_s"], c["first_token_s"], c["finish_s"], c["output_len"]

    def minus(a, b):
        return np.subtract(a, b, out=out(np.result_type(a, b)))

    c["queue_s"] = minus(c.pop("admitted_s"), arrival)
    c["ttft_s"] = minus(first, arrival)
    tpot = out(np.float64)
    tpot[:] = np.nan
    many = out_len > 1
    tpot[many] = (finish[many] - first[many]) / (out_len[many] - 1)
    c["tpot_s"] = tpot
    c["e2e_s"] = minus(finish, arrival)
    return pd.DataFrame({k: c[k] for k in REQUEST_COLS}, copy=False)


def strict_json(data, **kwargs) -> str:
    """``data`` as strict JSON: a figure with no value (a percentile over no request, NaN) is written ``null``,
    which every JSON reader takes, not ``NaN``, which strict ones refuse. ``kwargs`` go to ``json.dumps``."""
    def strict(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: strict(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [strict(x) for x in v]
        return v

    return json.dumps(strict(data), allow_nan=False, **kwargs)


def summary_json(summary: dict) -> str:
    """``summary`` as strict JSON (sorted keys, indented; no value is ``null``: :func:`strict_json`)."""
    return strict_json(summary, indent=2, sort_keys=True)


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
        # with a host tier: seconds the copies to and from host memory added to steps (what compute did not hide)
        **({"host_copy_s": float(steps.t_host_copy.sum())} if "t_host_copy" in steps else {}),
    }
