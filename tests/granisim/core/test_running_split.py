"""The scheduler's running requests split by ``decoding`` (``_decoding``, ``_prefilling``) stay the
running requests filtered in running order, through chunked prefills, admissions, finishes and
preemptions."""

import pytest

from granisim.core.scheduler import Scheduler
from tests.granisim.simhelpers import run, small


@pytest.mark.parametrize("over", [
    {"scheduler.max_batch_tokens": 512},  # long chunked prefills
    {"scheduler.max_batch_tokens": 700, "policy.name": "token", "workload.num_requests": 60},
    {"hardware.kv_budget_tokens": 6000, "workload.rate": 60.0},  # memory short: preemptions
    {"scheduler.max_batch_tokens": 1500, "workload.prefix_len": 3000, "scheduler.preempt_order": "lifo",
     "hardware.kv_budget_tokens": 9000},
])
def test_split_is_the_running_requests_in_order(over, monkeypatch):
    """After every schedule and postprocess, ``_decoding`` and ``_prefilling`` equal the running
    requests with and without ``decoding``, in running order. Planted bug caught: a preempted
    request left in ``_decoding``."""
    seen = {"checks": 0, "preemptions": 0}
    schedule, postprocess = Scheduler.schedule, Scheduler.postprocess

    def check(s):
        running = list(s.running.values())
        assert list(s._decoding.values()) == [r for r in running if r.decoding]
        assert list(s._prefilling.values()) == [r for r in running if not r.decoding]
        assert list(s._decoding) == [r.rid for r in running if r.decoding]
        seen["checks"] += 1
        seen["preemptions"] = max(seen["preemptions"], s.preemptions)

    def checked_schedule(s, now):
        plan = schedule(s, now)
        check(s)
        return plan

    def checked_postprocess(s, *a, **k):
        done = postprocess(s, *a, **k)
        check(s)
        return done

    monkeypatch.setattr(Scheduler, "schedule", checked_schedule)
    monkeypatch.setattr(Scheduler, "postprocess", checked_postprocess)
    run(small(**over))
    assert seen["checks"] > 100
    if "kv_budget_tokens" in str(over):
        assert seen["preemptions"] > 0  # the memory-short cases do preempt


def test_a_prefill_completing_out_of_admission_order_keeps_running_order():
    """When a request admitted earlier completes its prefill after a later one (the rebuild path of
    ``_start_decoding``; in the scenarios above prefills complete in admission order), ``_decoding``
    is still in running order, and the running requests are split exactly once. Planted bug caught:
    appending such a request at the end of ``_decoding`` instead of rebuilding it."""
    import random

    import numpy as np

    from granisim.core.request import Request
    from granisim.core.workload import RequestSpec
    from granisim.kv.allocator import make_allocator

    rng = random.Random(5)
    for _ in range(50):
        s = Scheduler(small().scheduler, make_allocator("granikv", 1000), group_size=4, m_sat=8)
        reqs = []
        for i in range(rng.randrange(2, 9)):
            r = Request(RequestSpec(i, 0.0, np.empty(0, np.int32), np.arange(5, dtype=np.int32), 3, 0))
            r.admit_order = i
            s.alloc.admit(i, r.tokens[:5])  # a decoding request's slots are tracked by the allocator
            s.running[i] = s._prefilling[i] = r
            reqs.append(r)
        for r in rng.sample(reqs, len(reqs)):  # prefills complete in any order
            r.decoding = True
            s._start_decoding(r)
            running = list(s.running.values())
            assert list(s._decoding.values()) == [q for q in running if q.decoding]
            assert list(s._prefilling.values()) == [q for q in running if not q.decoding]
