"""A simulation whose allocator only counts COLD slots (the cost executor without a host tier) makes
every decision the one that names them makes: the same requests and steps, to the bit."""

import pandas as pd
import pytest

import granisim.core.serving_loop as serving_loop
from tests.granisim.simhelpers import run, small

CASES = [
    {},  # multi-agent, granikv: HOT slabs and COLD suffixes
    {"policy.name": "token"},
    {"hardware.kv_budget_tokens": 6000, "workload.rate": 60.0},  # memory short: evictions, preemptions
    {"policy.name": "token", "hardware.kv_budget_tokens": 5000, "workload.rate": 60.0,
     "scheduler.preempt_order": "lifo"},
    {"workload.turns": 3, "workload.num_requests": 30, "hardware.kv_budget_tokens": 9000}  # sessions,
]


def _run(over, slot_ids):
    real = serving_loop.make_allocator

    def make(*a, **kw):
        kw["slot_ids"] = slot_ids
        return real(*a, **kw)

    serving_loop.make_allocator = make
    try:
        _, eng, res, reqs = run(small(**over))
    finally:
        serving_loop.make_allocator = real
    return eng, reqs, res.steps.frame()


@pytest.mark.parametrize("over", CASES)
def test_counting_cold_slots_changes_no_result(over):
    """Planted bugs caught (each tried): the counting pool's free giving back one slot fewer (evictions
    and the step log's occupancy differ), its allocate taking one more."""
    named, counted = _run(over, True), _run(over, False)
    assert type(named[0].allocator.store.pool).__name__ == "ColdPool"
    assert type(counted[0].allocator.store.pool).__name__ == "CountingColdPool"
    pd.testing.assert_frame_equal(named[1], counted[1])
    pd.testing.assert_frame_equal(named[2], counted[2])
    assert named[0].allocator.stats() == counted[0].allocator.stats()
