"""Shared pieces of the calibration fits: relative errors, their summary, seeded folds, and a bounded
Levenberg-Marquardt solver.

Each fitted family holds out its own rows (per-family seeds), so families with equally many
rows do not hold out the same positions.
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


def lm_fit(resid, x0, lo, hi, iters: int = 40):
    """Minimise ||resid(x)||^2 over lo <= x <= hi (box by clipping) by Levenberg-Marquardt with a
    forward-difference Jacobian. Returns (x, cost)."""
    x = np.clip(np.asarray(x0, float), lo, hi)
    r = resid(x)
    cost = float(r @ r)
    lam = 1e-2
    for _ in range(iters):
        J = np.empty((r.size, x.size))
        for j in range(x.size):
            h = 1e-4 * max(1.0, abs(x[j]))
            xj = x.copy()
            xj[j] = xj[j] + h if xj[j] + h <= hi[j] else xj[j] - h
            J[:, j] = (resid(xj) - r) / (xj[j] - x[j])
        A, g = J.T @ J, J.T @ r
        improved = False
        for _ in range(12):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            xn = np.clip(x + step, lo, hi)
            rn = resid(xn)
            cn = float(rn @ rn)
            if np.isfinite(cn) and cn < cost:
                done = cost - cn < 1e-12 * max(cost, 1e-30) or np.max(np.abs(xn - x)) < 1e-9
                x, r, cost = xn, rn, cn
                lam = max(lam / 3.0, 1e-9)
                improved = True
                break
            lam *= 4.0
        if not improved or done:
            break
    return x, cost
