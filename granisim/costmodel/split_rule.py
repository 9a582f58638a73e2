"""How the attention launchers split a pass along KV: one rule for the kernels and their prices.

``gpu_backend.kernels.split_kv`` / ``dense`` call these functions with one launch's integers to
size their grids; the cost model (:mod:`granisim.costmodel.kernels`) calls them with arrays of
shapes and the profile's values of the same constants, to count the programs it prices. Plain
numpy (no torch): scalars in, 0-d arrays out; arrays broadcast.
"""

from __future__ import annotations

import numpy as np


def whole_tiles(kv_len, n, block_n):
    """The chunk of ``kv_len`` tokens cut into ``n`` splits: each a whole number of ``block_n`` tiles."""
    return np.ceil(np.ceil(kv_len / n) / block_n) * block_n


def kv_splits(base, kv_len, block_n, *, target, round_up, min_chunk, max_splits, max_chunk=0):
    """(n_splits, chunk): split a launch of ``base`` programs along KV until about ``target``
    programs run (the split count rounded up where ``round_up``, else down, for kernels that want
    whole waves), and until no split is longer than ``max_chunk`` tokens (0: no such cap); at
    least ``min_chunk`` tokens per split, at most ``max_splits`` splits; ``chunk`` is a whole
    number of ``block_n`` tiles. A sequence of ``kv_len`` 0 is one split of one tile."""
    base = np.maximum(np.asarray(base, float), 1.0)
    kv_len = np.asarray(kv_len, float)
    target = np.asarray(target, float)
    want = np.where(round_up, np.ceil(target / base), np.maximum(1.0, np.floor(target / base)))
    max_chunk = np.asarray(max_chunk, float)
    want = np.where(max_chunk > 0, np.maximum(want, np.ceil(kv_len / np.maximum(max_chunk, 1.0))), want)
    n = np.maximum(1.0, np.minimum(np.minimum(want, np.ceil(kv_len / min_chunk)), max_splits))
    chunk = whole_tiles(kv_len, n, block_n)
    chunk = np.where(kv_len > 0, chunk, block_n)
    return np.where(kv_len > 0, np.ceil(kv_len / chunk), 1.0), chunk


def skewed(longest, mean, *, balance_skew):
    """A batch the launchers balance: its longest KV length over ``balance_skew`` x its mean."""
    return np.asarray(longest, float) > balance_skew * np.ceil(np.asarray(mean, float))


def balance_cap(longest, mean, *, balance_chunk, balance_skew):
    """Longest split for a batch of these longest / mean KV lengths: ``max(balance_chunk, mean)``
    where the batch is :func:`skewed`, else 0 (no cap)."""
    cap = np.maximum(balance_chunk, np.ceil(np.asarray(mean, float)))
    return np.where(skewed(longest, mean, balance_skew=balance_skew), cap, 0.0)


# Cost of a split in the dense rule, in KV tokens of one wave per row tile of a split: its fp32 partials written,
# read back by the combine launch and reduced. Measured: the value that picks the fastest split count (or one
# within 8%) at each of 27 launches, G = 4/5/8 query heads per KV head, B = 64-512 rows, L = 1K-16K
# (gpu_backend/bench/dense_splits.py on an H100, 2026-12-06, reports/kernels/dense_splits/); any value in
# 0.05-0.06 does the same, the earlier cost per KV token (0.02 n L / 8) picked up to 2.4x slower launches.
DENSE_SPLIT_COST = 0.05


def dense_splits(base, kv_len, block_n, *, sms, max_splits, block_m=128):
    """(n_splits, chunk) of the dense prefix pass (one program per SM): of 1..``max_splits``, the
    first split count minimising ``waves * (chunk + block_n)`` plus, when split,
    ``DENSE_SPLIT_COST * n * base * block_m`` — the fullest last wave per unit of work against what
    each split's partials cost. ``base`` may be an array of launches over the same ``kv_len`` (> 0)."""
    base = np.atleast_1d(np.asarray(base, float))
    L = float(kv_len)
    s = np.arange(1, int(max_splits) + 1, dtype=float)[:, None]
    chunk = whole_tiles(L, s, block_n)
    n = np.ceil(L / chunk)
    waves = np.ceil(base[None, :] * n / sms)
    cost = waves * (chunk + block_n) + np.where(n > 1, DENSE_SPLIT_COST * n * base[None, :] * block_m, 0.0)
    i = np.argmin(cost, axis=0)
    return n[i, 0], chunk[i, 0]
