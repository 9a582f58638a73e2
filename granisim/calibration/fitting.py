"""Shared pieces of the calibration fits: relative errors, their summary, and seeded folds.

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
