"""scripts/validation_replay.py: TPOT recomputed on a measured schedule with other step durations."""
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest


import granisim.validation.replay as V


def _plans():
    """Request 0: prompt 8 in two chunks (steps 0, 1), then decodes in steps 2 and 3. Request 1: prompt 2 in
    step 1, decodes in steps 2, 3 and 4."""
    r = lambda rid, ctx, n: NS(rid=rid, context_len=ctx, num_new=n)  # noqa: E731
    return [NS(requests=[r(0, 0, 4)]), NS(requests=[r(0, 4, 4), r(1, 0, 2)]), NS(requests=[r(0, 8, 1), r(1, 2, 1)]),
            NS(requests=[r(0, 9, 1), r(1, 3, 1)]), NS(requests=[r(1, 4, 1)])]


def test_tpot_counts_from_each_request_first_token():
    plans, plen = _plans(), {0: 8, 1: 2}
    meas = np.array([1.0, 1.0, 0.5, 0.5, 0.5])
    # request 0: tokens at the ends of steps 1, 2, 3 -> (3.0 - 2.0) / 2; request 1: steps 1..4 -> 1.5 / 3
    assert V.tpot_percentiles(plans, meas, plen)[0] == pytest.approx(np.median([0.5, 0.5]))
    slow = meas.copy()
    slow[3] = 1.5  # one decode step 1 s longer: both requests' windows grow by 1 s
    assert V.tpot_percentiles(plans, slow, plen) == pytest.approx((np.median([2.0 / 2, 2.5 / 3]),
                                                                   2.5 / 3 + 0.99 * (2.0 / 2 - 2.5 / 3)))
    slow_chunk = meas.copy()
    slow_chunk[0] = 5.0  # a prefill chunk before request 0's first token: no TPOT moves
    assert V.tpot_percentiles(plans, slow_chunk, plen)[0] == pytest.approx(0.5)
