"""Shared pieces of the calibration fits: relative errors, their summary, seeded folds, and the bounded
least-squares solver.

Each fitted family holds out its own rows (per-family seeds), so families with equally many
rows do not hold out the same positions.

Solver: ``scipy.optimize.least_squares`` (bounded TRF, forward-difference Jacobian), not the
hand-written bounded Levenberg-Marquardt (box by clipping, at most 40 iterations) the fit used
before. Measured on the H200 raw data (calibration/raw/h200), every attention / KV family fitted
on all rows from the same starts (``fit_attention_rows``): TRF needed 18,473 residual evaluations
against 23,067 (40.1 s against 41.2 s of CPU for the whole process, on a shared 2-core machine), and
reached a lower sum of squared log errors in the families fitted on their own rows (merge 0.3925 vs
0.3933, KV write 0.12874 vs 0.12883, KV copy equal, cascade 0.5571 vs 0.5580, dense 0.5501 vs
0.5512, prefill 0.7794 vs 0.7837) but decode (0.81774 vs 0.81773); the storage family is fitted
after them and is not comparable). Where the data barely constrain a coefficient the two land on
different values at nearly the same error (prefill flop_eff 0.39 vs the old 1.0 at its bound,
cascade sat_ctas_per_sm 0.19 vs 0.25); the predicted times on the calibration rows agree (the
test in tests/granisim/test_calibration_speed.py). Commands: the measurement harness timed
``fit_attention_rows`` on the rows ``fit_attention`` uses, with each solver in turn.

The whole fit (``granisim calibrate fit calibration/raw/h200``) spent its time in the solver's
residual evaluations (cProfile: 99% in ``predict_attention``), most of it re-fitting every
cross-validation fold from scratch (5 folds + the final fit, each 4 starts x 5 whole-number
values per kernel family); the folds now re-fit warm from the all-rows solution, and the
whole-number values and the folds run on local processes (fit.py; the profile written is
byte-identical with one process). Measured with ``/usr/bin/time -v granisim calibrate fit
calibration/raw/h200 --out P.json`` on the shared 2-core machine (load average 9-13 from other
jobs, so wall times there are not the machine's): before, 527 s wall; warm folds alone, 56 s of
CPU in one process; warm folds + TRF, 64 s of CPU in one process (at the higher load). With two
processes, the parts that run in parallel are most of that, so an idle 2-core machine should
take well under a minute; not measured idle.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from .raw import holdout


def rel_err(pred, meas) -> np.ndarray:
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)


def summary(err) -> dict:
    err = np.asarray(err)
    if err.size == 0:
        return {"n": 0, "median": float("nan"), "p90": float("nan")}
    return {"n": int(err.size), "median": float(np.median(err)), "p90": float(np.quantile(err, 0.9))}


def fam_seed(seed: int, fam: str) -> int:
    """A per-family seed (families with equally many rows do not hold out the same positions)."""
    return seed + zlib.crc32(fam.encode()) % 100_000


def folds_of(df: pd.DataFrame, folds: int, seed: int, frac: float = 0.2) -> np.ndarray:
    """Fold index per row, drawn per family (seeded). folds = 1: one split, 20% of each family held
    out (fold 0), the rest -1 (never held out); folds = k > 1: k-fold, each fold holds out ~1/k."""
    out = np.full(len(df), -1)
    for fam, idx in df.groupby("family").indices.items():
        if folds <= 1:
            out[idx[holdout(len(idx), frac, fam_seed(seed, fam))]] = 0
        else:
            perm = np.random.default_rng(fam_seed(seed, fam)).permutation(len(idx))
            out[idx[perm]] = np.arange(len(idx)) % folds
    return out


NONFINITE_RESIDUAL = 1e3  # a log-ratio far worse than any fit: steers the solver away from NaN / inf


def bounded_fit(resid, x0, lo, hi):
    """Minimise ||resid(x)||^2 over lo <= x <= hi: ``scipy.optimize.least_squares``, bounded
    trust-region reflective (TRF), forward-difference Jacobian. Returns (x, cost = ||r||^2)."""
    from scipy.optimize import least_squares

    def r(x):
        v = resid(x)
        return np.where(np.isfinite(v), v, NONFINITE_RESIDUAL)

    x0 = np.clip(np.asarray(x0, float), lo, hi)
    res = least_squares(r, x0, bounds=(lo, hi), method="trf", jac="2-point", ftol=1e-8, xtol=1e-10, gtol=1e-10)
    return res.x, float(res.fun @ res.fun)
