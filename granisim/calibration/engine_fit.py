"""Engine calibration: the cost model's per-key times set against the real engine's, step by step.

The microbenchmark fit (fit.py) prices each operator alone; inside the real engine each
breakdown key also pays what isolation hides (in-graph timing marks and gaps per layer,
padding, the suffix pass's short contexts). From validation runs (``steps.parquet``: the same
plan priced and measured) this fits, per key, ``measured = scale * predicted + offset * launches``
(least squares on relative error, offset >= 0; launches: the key's kernel launches in the step, 1-2
for attn_decode, one per prefix pass for attn_prefix, else 1; the graph steps' linear offset by step
size, at LINEAR_KNOTS), and the per-step host overhead as
``step_s + per_request_s * requests + per_kv_token_s * kv_tokens + per_pass_s * passes + rebuild_s * rebuilds``
(steps need ``kv_tokens``, ``passes``, ``rebuilds`` and ``decode_launches`` columns: `host_work`). `with_engine` returns a profile
carrying them (granisim.costmodel applies them). Fit on some workloads, judge on the others.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from granisim.config.coefficients import LINEAR_KNOTS
from granisim.costmodel import ENGINE_KEYS
from granisim.costmodel.host_build import repeats
from granisim.config.hardware import OPTIONAL_COEFFICIENTS, Coefficient, HardwareProfile, Source

MIN_POINTS = 10
SCALE_RANGE = (0.5, 2.0)  # the engine runs the same kernels: a scale outside this is a fit artefact
# A scale is fitted only where the model's times span at least this ratio (p90 / p10): over a narrow range
# scale and offset cannot be told apart, and a scale fitted there (e.g. on the control run's 64-token prefix
# passes, all ~0.16 ms) would be applied to passes 15x longer. Below it: scale 1, offset only.
MIN_SPREAD = 1.5


def _best_offset(x: np.ndarray, y: np.ndarray, n: np.ndarray, a: float) -> float:
    """b minimising sum(((a x + b n - y) / y)^2) for a given scale a."""
    wn = n / y
    return float(((y - a * x) / y * wn).sum() / (wn * wn).sum())


def _relative_lsq(x: np.ndarray, y: np.ndarray, n: np.ndarray | None = None) -> tuple[float, float]:
    """(a in SCALE_RANGE, b >= 0) minimising sum(((a x + b n - y) / y)^2), ``n`` the launches of the key in
    each step (default 1); a = 1 where x spans less than MIN_SPREAD (a workload whose key barely varies cannot
    tell scale from offset)."""
    n = np.ones_like(x) if n is None else np.asarray(n, float)
    w = 1.0 / y
    wn = w * n

    lo, hi = np.quantile(x, [0.1, 0.9])
    if hi < MIN_SPREAD * lo:
        b = _best_offset(x, y, n, 1.0)
        if b >= 0:
            return 1.0, b
    (a, b), *_ = np.linalg.lstsq(np.stack([x * w, wn], axis=1), np.ones_like(y), rcond=None)
    if not SCALE_RANGE[0] <= a <= SCALE_RANGE[1]:  # scale clamped: best offset for it
        a = float(np.clip(a, *SCALE_RANGE))
        b = _best_offset(x, y, n, a)
    if b < 0:  # offset clamped at 0: refit the scale alone
        r = x * w
        a, b = float(np.clip(r.sum() / (r * r).sum(), *SCALE_RANGE)), 0.0
    return float(a), float(b)


def _floored_lsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(a, b, F) minimising the relative squared error of max(a x + b, F): steps clearly above a floor
    F fix a, b; F is chosen among the measured values (host-bound eager steps all take about F)."""
    def loss(a, b, f):
        return float((((np.maximum(a * x + b, f) - y) / y) ** 2).sum())

    a, b = _relative_lsq(x, y)
    best = (loss(a, b, 0.0), a, b, 0.0)
    for f in np.quantile(y, np.linspace(0.05, 0.9, 18)):
        above = y > 1.1 * f
        if above.sum() >= 3:
            a, b = _relative_lsq(x[above], y[above])
            best = min(best, (loss(a, b, f), a, b, float(f)))
    return best[1], best[2], best[3]


def _knot_offsets(tokens: np.ndarray, x: np.ndarray, y: np.ndarray, scale: float, prior: float) -> np.ndarray:
    """Offsets at LINEAR_KNOTS (>= 0) minimising sum(((scale x + b(tokens) - y) / y)^2), b log-linear in tokens
    between the knots (flat beyond them), plus one pseudo-step per knot at ``prior``: a knot without steps
    near it keeps the flat offset."""
    k = np.log2(LINEAR_KNOTS)
    t = np.log2(np.maximum(tokens, 1))
    # column j: the weight of knot j in each step's offset, interpolated as the cost model prices it (np.interp)
    basis = np.stack([np.interp(t, k, e) for e in np.eye(len(k))], axis=1)
    w = 1.0 / y
    pw = float(w.mean())
    A = np.vstack([basis * w[:, None], pw * np.eye(len(k))])
    b = np.concatenate([(y - scale * x) * w, np.full(len(k), prior * pw)])
    return np.maximum(np.linalg.lstsq(A, b, rcond=None)[0], 0.0)


def _host_offset_lsq(x: np.ndarray, y: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """(1, b >= 0) minimising sum((x + b n - y)^2): the model's device time plus a mean host excess per launch,
    stalls included. The scale stays 1: these keys' times barely follow the model's in the validation runs,
    and a slope fitted there would be carried to other workloads' large, device-bound eager launches."""
    return 1.0, max(0.0, float(((y - x) * n).sum() / (n * n).sum()))


def _offset_lsq(x: np.ndarray, y: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """(1, b >= 0) minimising sum(((x + b n - y) / y)^2): the model's time as it stands plus an offset."""
    return 1.0, max(0.0, _best_offset(x, y, n, 1.0))


LAUNCHES = {"attn_decode": "decode_launches", "attn_prefix": "passes"}  # keys launched more than once a step
# Eager steps launch every kernel from the host, and their small attention and KV kernels wait on it: their
# times scatter with the host's delays (a few steps in a run take 10-30 ms more, reports/validation/).
# Those keys get the model's time plus a host excess per launch fitted to the mean (absolute error), which is
# what a request's TPOT sums, not to the typical step (relative error).
HOST_BOUND_EAGER = ("attn_decode", "attn_prefix", "merge", "kv_write")
# Prefill attention is priced by its own kernel's microbenchmark, whose error depends on the shapes (chunk and
# cached-prefix lengths) and not on the engine: a scale fitted on some workloads' chunks does not carry to another's.
# Fitted on the control's and Azure's prefill, the scale came out 1.55 for graph steps and 1.10 for 2-4K-token
# eager steps, against 0.97-1.06 with the multi-agent's 16K-prefix chunks in the fit, and the held-out
# multi-agent's TPOT p50 was 10-17% off end to end. So its scale stays 1 and the engine adds an offset per step.
UNIT_SCALE = ("attn_prefill",)


def _fit_keys(df: pd.DataFrame, prefix: str) -> dict[str, float]:
    out = {}
    for k in ENGINE_KEYS:
        m, p = df[f"measured_{k}"].to_numpy(float), df[f"predicted_{k}"].to_numpy(float)
        n = df[LAUNCHES[k]].to_numpy(float) if k in LAUNCHES else np.ones_like(m)
        ok = (m > 0) & (p > 0) & (n > 0)
        if ok.sum() < MIN_POINTS:
            continue
        if prefix == "engine.eager." and k in HOST_BOUND_EAGER:
            lsq = _host_offset_lsq
        elif k in UNIT_SCALE:
            lsq = _offset_lsq
        else:
            lsq = _relative_lsq
        out[f"{prefix}{k}.scale"], out[f"{prefix}{k}.offset_s"] = lsq(p[ok], m[ok], n[ok])
    return out


def fit(steps: list[pd.DataFrame], graph_max: int, layers: int = 0) -> dict[str, float]:
    """Coefficient values (``engine.<key>.scale/offset_s`` for graph-replayed steps, ``engine.eager.*`` for
    steps of more than ``graph_max`` tokens, ``overhead.step_s/per_request_s/per_kv_token_s/per_pass_s``).
    ``graph_max`` is the CUDA-graph row limit of the executor that measured ``steps`` (its ``stats()``);
    ``layers``, the layers of the model they ran (``engine.fit_layers``: the per-layer offsets scale to other
    models by it; 0: not recorded)."""
    df = pd.concat(steps, ignore_index=True)
    eager = df["tokens"] > graph_max
    out = _fit_keys(df[~eager], "engine.")
    if "engine.linear.scale" in out:  # the graph steps' linear offset by step size
        g = df[~eager & (df["measured_linear"] > 0) & (df["predicted_linear"] > 0)]
        knots = _knot_offsets(g["tokens"].to_numpy(float), g["predicted_linear"].to_numpy(float),
                              g["measured_linear"].to_numpy(float), out["engine.linear.scale"],
                              out["engine.linear.offset_s"])
        out.update({f"engine.linear.offset_t{n}_s": float(v) for n, v in zip(LINEAR_KNOTS, knots)})
    fitted = _fit_keys(df[eager], "engine.eager.")
    for k in ENGINE_KEYS:  # too few eager points for a key: the graph set stands in
        for c in ("scale", "offset_s"):
            if f"engine.{k}.{c}" in out:
                out[f"engine.eager.{k}.{c}"] = fitted.get(f"engine.eager.{k}.{c}", out[f"engine.{k}.{c}"])
    out["engine.graph_max_tokens"] = float(graph_max)
    if layers:
        out["engine.fit_layers"] = float(layers)
    if "engine.eager.linear.scale" in fitted:
        x, y = df.loc[eager, "predicted_linear"].to_numpy(float), df.loc[eager, "measured_linear"].to_numpy(float)
        (out["engine.eager.linear.scale"], out["engine.eager.linear.offset_s"],
         out["engine.eager.linear_floor_s"]) = _floored_lsq(x, y)
    # host overhead = step + per_request * requests + per_kv_token * private KV tokens read (slot lists)
    #                 + per_pass * prefix passes (each pass's group maps and storage are built and uploaded)
    #                 + rebuild * (the step is built in full, not derived from the one before: host_build.py)
    m = df["measured_overhead"].to_numpy(float)
    ok = m > 0
    w = 1.0 / m[ok]
    X = np.stack([np.ones(ok.sum())] + [df[c].to_numpy(float)[ok] for c in HOST_TERMS], axis=1)
    coef, *_ = np.linalg.lstsq(X * w[:, None], np.ones(ok.sum()), rcond=None)
    coef = np.maximum(coef, 0.0)
    (out["overhead.step_s"], out["overhead.per_request_s"], out["overhead.per_kv_token_s"],
     out["overhead.per_pass_s"], out["overhead.rebuild_s"]) = map(float, coef)
    return out


HOST_TERMS = ("batch", "kv_tokens", "passes", "rebuilds")  # the host overhead's columns beside its constant


def host_work(plan, after=None) -> dict[str, int]:
    """What the engine builds and launches for a plan beyond its requests: ``kv_tokens``, the private KV tokens
    of its decode rows (listed slot by slot, as the cost model's `tok`); ``passes``, its prefix passes (one per
    (path, storage) of its cascade/dense groups, as the cost model prices them); ``rebuilds``, 1 if its step is
    built in full, 0 if the engine derives it from ``after``'s (the plan before it; host_build.py);
    ``decode_launches``, 0-2 (whole-context decode rows, suffix rows of pass members)."""
    grouped = {i for g in plan.groups if g.path in ("cascade", "dense") for i in g.members}
    dec = [i for i, r in enumerate(plan.requests) if not r.is_prefill]
    kv = sum(plan.requests[i].context_len + 1 - (plan.requests[i].shared_len if i in grouped else 0) for i in dec)
    passes = {(g.path, g.storage) for g in plan.groups if g.path in ("cascade", "dense")}
    return {"kv_tokens": kv, "passes": len(passes), "rebuilds": int(not repeats(after, plan)),
            "decode_launches": any(i not in grouped for i in dec) + any(i in grouped for i in dec)}


def unit_of(name: str) -> str:
    return OPTIONAL_COEFFICIENTS[name][0] if name in OPTIONAL_COEFFICIENTS else "s"


# The real engine's host-tier copies run on a side stream the compute stream waits for before the layers
# (gpu_backend/executor/transfers.py): an engine-calibrated profile hides none of them.
ENGINE_HOST_OVERLAP = {"value": 0.0, "unit": "", "source": {
    "kind": "extrapolated",
    "from": "gpu_backend/executor/transfers.py: the real engine runs a step's host-tier copies on a side stream that "
            "the compute stream waits for before the layers",
    "how": "by construction: the engine hides none of its copies (h200 keeps 0.749, measured on an H100 for a copy "
           "stream beside the layers); measure when the engine overlaps them"}}
ENGINE_HOST_DUPLEX = {"value": 0.0, "unit": "", "source": {
    "kind": "measured",
    "date": "2026-12-03",
    "command": "sum over RAW/host_tier/machineR/k64/token_tier (reports/host_tier/README.md): measured_kv_copy of steps.parquet against each plan's transfers priced by granisim.costmodel.transfers.copy_seconds",
    "gpu": "NVIDIA H200",
    "commit": "14b46f5",
    "note": "the engine runs both directions' copies on one side stream (gpu_backend/executor/transfers.py): in "
            "the 254 steps of a serving run that moved KV, 135 of them both ways, the measured copy time (5.48 s) "
            "is the sum of the two directions' priced times (5.32 s), not the slower one (4.07 s); per-step median "
            "error 5.8% against 27%"}}


def with_engine(profile: HardwareProfile, values: dict[str, float], source: Source) -> HardwareProfile:
    coefs = {**profile.coefficients, **{n: Coefficient(float(v), unit_of(n), source) for n, v in values.items()}}
    return replace(profile, coefficients=coefs)
