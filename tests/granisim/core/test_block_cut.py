"""Where the serving loop cuts a fast-forward block: at the first step boundary at or after the next event."""

import random
from types import SimpleNamespace

import numpy as np
import pytest

from granisim.core.serving_loop import PendingTimes, ServingLoop, _first_boundary


def _loop_at(now: float, arrival: float | None, expiry: float | None):
    pending = PendingTimes()
    if arrival is not None:
        pending.push(arrival)
    return SimpleNamespace(feed=None, _pending=pending, env=SimpleNamespace(now=now),
                           scheduler=SimpleNamespace(next_expiry=lambda: expiry))


@pytest.mark.parametrize("seed", range(200))
def test_block_cut_is_the_first_step_reaching_the_next_event(seed):
    """The steps kept equal ``np.searchsorted(np.cumsum(durations), gap, "left") + 1`` (at most the
    block), for gaps before, inside, exactly at a step boundary and beyond the block. Planted bug
    caught: a step ending exactly at the event not counted as reaching it (``>`` for ``>=``)."""
    rng = random.Random(seed)
    k = rng.randrange(1, 40)
    durations = tuple(rng.choice((0.5, 0.25, 1e-3 * rng.random(), rng.random())) for _ in range(k))
    cum = np.cumsum(durations)
    now = rng.random() * 100
    gap = rng.choice((-1.0, 0.0, float(cum[rng.randrange(k)]), float(cum[-1]) * rng.random(), float(cum[-1]) + 1))
    which = rng.randrange(3)
    loop = _loop_at(now, now + gap if which != 1 else None, now + gap if which else None)
    want = int(min(k, np.searchsorted(cum, (now + gap) - now, side="left") + 1))
    assert ServingLoop._steps_until_event(loop, durations, k) == want
    # a fleet replica's block, cut when a request is routed to it ``gap`` seconds after its start
    assert _first_boundary(durations, gap, k) == int(min(k, np.searchsorted(cum, gap, side="left") + 1))
    assert ServingLoop._steps_until_event(_loop_at(now, None, None), durations, k) == k
