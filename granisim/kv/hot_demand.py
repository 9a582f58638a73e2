"""Recent demand for HOT slabs: the target size of an adaptive HOT pool.

Owned by :class:`granisim.kv.hot_slabs.HotSlabs` when ``hot_fraction = "adaptive"`` (with
a fixed fraction there is none). The allocator reports every declared shared prefix it
sees (:meth:`HotDemand.note`, on ``can_admit`` and ``admit``) and every admission that
declares one (:meth:`HotDemand.count_admission`); :meth:`HotDemand.total` is the total
length of the distinct shared prefixes asked for in the last ``window`` such admissions.
"""

from __future__ import annotations

import numpy as np

DEMAND_WINDOW = 256  # admissions over which a shared prefix counts as in demand (adaptive HOT)


class HotDemand:
    def __init__(self, window: int = DEMAND_WINDOW):
        self.window = window
        self.admissions = 0  # admissions that declared a shared prefix
        # shared prefix (hash of its tokens) -> (length, admission count when last asked)
        self._asked: dict[int, tuple[int, int]] = {}

    def note(self, tokens: np.ndarray, shared_len: int) -> None:
        self._asked[hash(tokens[:shared_len].tobytes())] = (shared_len, self.admissions)

    def count_admission(self) -> None:
        self.admissions += 1

    def total(self) -> int:
        """Tokens of the distinct shared prefixes asked for in the last ``window`` admissions."""
        horizon = self.admissions - self.window
        stale = [k for k, (_, t) in self._asked.items() if t < horizon]
        for k in stale:
            del self._asked[k]
        return sum(n for n, _ in self._asked.values())
