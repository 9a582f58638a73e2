"""Engine calibration: the cost model's per-key times set against the real engine's, step by step.

The microbenchmark fit (fit.py) prices each operator alone; inside the real engine each
breakdown key also pays what isolation hides (in-graph timing marks and gaps per layer,
padding, the suffix pass's short contexts). From validation runs (``steps.parquet``: the same
plan priced and measured) this fits, per key, ``measured = scale * predicted + offset``
(least squares on relative error, offset >= 0), and the per-step host overhead as
``step_s + per_request_s * requests + per_kv_token_s * kv_tokens`` (steps need a ``kv_tokens``
column: `kv_tokens_read`). `with_engine` returns a profile carrying them
(granisim.costmodel applies them). Fit on some workloads, judge on the others.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from granisim.costmodel import ENGINE_KEYS
from granisim.hardware import Coefficient, HardwareProfile, Source

MIN_POINTS = 10


def _relative_lsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b >= 0) minimising sum(((a x + b - y) / y)^2)."""
    w = 1.0 / y
    (a, b), *_ = np.linalg.lstsq(np.stack([x * w, w], axis=1), np.ones_like(y), rcond=None)
    if b < 0:  # offset clamped at 0: refit the scale alone
        r = x * w
        a, b = float(r.sum() / (r * r).sum()), 0.0
    return float(a), float(b)


def fit(steps: list[pd.DataFrame]) -> dict[str, float]:
    """Coefficient values (``engine.<key>.scale/offset_s``, ``overhead.step_s/per_request_s``)."""
    df = pd.concat(steps, ignore_index=True)
    out: dict[str, float] = {}
    for k in ENGINE_KEYS:
        m, p = df[f"measured_{k}"].to_numpy(float), df[f"predicted_{k}"].to_numpy(float)
        ok = (m > 0) & (p > 0)
        if ok.sum() >= MIN_POINTS:
            out[f"engine.{k}.scale"], out[f"engine.{k}.offset_s"] = _relative_lsq(p[ok], m[ok])
    # host overhead = step + per_request * requests + per_kv_token * private KV tokens read (slot lists)
    m = df["measured_overhead"].to_numpy(float)
    ok = m > 0
    w = 1.0 / m[ok]
    X = np.stack([np.ones(ok.sum()), df["batch"].to_numpy(float)[ok], df["kv_tokens"].to_numpy(float)[ok]], axis=1)
    coef, *_ = np.linalg.lstsq(X * w[:, None], np.ones(ok.sum()), rcond=None)
    coef = np.maximum(coef, 0.0)
    out["overhead.step_s"], out["overhead.per_request_s"], out["overhead.per_kv_token_s"] = map(float, coef)
    return out


def kv_tokens_read(plan) -> int:
    """Private KV tokens of a plan's decode rows: what the host lists slot by slot (as the cost model's `tok`)."""
    grouped = {i for g in plan.groups if g.path in ("cascade", "dense") for i in g.members}
    return sum(r.context_len + 1 - (r.shared_len if i in grouped else 0)
               for i, r in enumerate(plan.requests) if not r.is_prefill)


def with_engine(profile: HardwareProfile, values: dict[str, float], source: Source) -> HardwareProfile:
    coefs = dict(profile.coefficients)
    for name, v in values.items():
        unit = "" if name.endswith(".scale") else "s"
        coefs[name] = Coefficient(float(v), unit, source)
    return HardwareProfile(profile.name, profile.gpu, coefs, profile.linear_table, profile.notes, profile.path,
                           profile.kernel_table)
