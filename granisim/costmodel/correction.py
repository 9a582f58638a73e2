"""Measured corrections: a kernel table's measured / modelled ratios, interpolated (form 2)."""

from __future__ import annotations

import math

import numpy as np


class Correction:
    """A multiplicative correction ``exp(r(x[, y]))`` from scattered points ``(x, y, r)`` (log2 axes):
    linear along ``y`` within each measured ``x`` column, then linear across columns, tabulated on a
    regular grid and read back bilinearly; constant beyond the measured range (clamped)."""

    def __init__(self, x, r, y=None, n: int = 65):
        x, r = np.asarray(x, float), np.asarray(r, float)
        ux = np.unique(x)
        self.gx = np.linspace(ux[0], ux[-1], n) if ux.size > 1 else ux
        if y is None:
            rr = np.array([r[x == u].mean() for u in ux])
            self.grid = np.interp(self.gx, ux, rr)[:, None]
            self.gy = np.zeros(1)
            return
        y = np.asarray(y, float)
        uy = np.unique(y)
        self.gy = np.linspace(uy[0], uy[-1], n) if uy.size > 1 else uy
        cols = []
        for u in ux:
            m = x == u
            yy = np.unique(y[m])
            rr = np.array([r[m][y[m] == v].mean() for v in yy])
            cols.append(np.interp(self.gy, yy, rr))
        cols = np.asarray(cols)  # [len(ux), len(gy)]
        self.grid = np.stack([np.interp(self.gx, ux, cols[:, j]) for j in range(self.gy.size)], axis=1)

    @staticmethod
    def _pos(g, v):
        if g.size == 1:
            return np.zeros_like(v, dtype=int), np.zeros_like(v, dtype=float)
        f = np.clip((v - g[0]) / (g[1] - g[0]), 0.0, g.size - 1.0)
        i = np.minimum(f.astype(int), g.size - 2)
        return i, f - i

    def __call__(self, x, y=None):
        x = np.asarray(x, float)
        y = np.zeros_like(x) if y is None else np.asarray(y, float)
        x, y = np.broadcast_arrays(x, y)
        i, fx = self._pos(self.gx, x)
        j, fy = self._pos(self.gy, y)
        g = self.grid
        i1 = np.minimum(i + 1, g.shape[0] - 1)
        j1 = np.minimum(j + 1, g.shape[1] - 1)
        v = ((1 - fx) * (1 - fy) * g[i, j] + fx * (1 - fy) * g[i1, j]
             + (1 - fx) * fy * g[i, j1] + fx * fy * g[i1, j1])
        return np.exp(v)


def storage_class(storage, page_size) -> str:
    """The kernel-table storage a plan's storage reads like: 'slab', 'slots' (page 1), 'pages16'."""
    if storage == "slab":
        return "slab"
    if storage in ("cold", "token", "hot") or page_size < 4:
        return "slots"
    return "pages16"


def page_eff(storage, page_size: int, page1: float, page16: float) -> float:
    """Read efficiency of KV outside a slab, given the efficiencies at page sizes 1 and 16: page size 1
    for 'cold', 'token' and a non-contiguous 'hot' run; pages of ``page_size`` for 'paged' (or None = the
    plan's private storage), interpolated in log2(page size), flat above 16."""
    if storage in ("cold", "token", "hot"):
        page_size = 1
    elif storage not in ("paged", None):
        raise ValueError(f"unknown KV storage {storage!r}; expected slab, cold, token, hot or paged")
    x = min(1.0, math.log2(max(1, page_size)) / 4.0)
    return page1 + (page16 - page1) * x


def multi_prefill_factor(reqs, gain: float, cached: float) -> float:
    """How much longer an eager step's prefill attention takes when it prefills the requests ``reqs`` together
    than the same launch alone: ``1 + g * (n - 1) / n`` for ``n`` requests (1 for one; saturating at ``1 + g``),
    ``g = gain``, or ``cached * gain`` where every request prefills over cached context (``context_len`` > 0)."""
    n = len(reqs)
    if n < 2:
        return 1.0
    if cached != 1.0 and all(r.context_len > 0 for r in reqs):
        gain *= cached
    return 1.0 + gain * (n - 1) / n
