"""Initial arrivals read lazily (``InitialSpecs``, the arrival queue's cursor, ``PendingTimes``)
give the same specs in the same order as the up-front list and heaps they replace."""

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from granisim.config.scenario import parse_scenario
from granisim.core.serving_loop import PendingTimes
from granisim.core.workload import ArrivalQueue, InitialSpecs, RequestSpec, Workload, load_trace

TRACE = load_trace()


def workload(kind="multi_agent", n=120, **wl):
    cfg = {"kind": kind, "num_requests": n, "rate": 5.0, **wl}
    if kind == "multi_agent":
        cfg.setdefault("roles", 3)
        cfg.setdefault("prefix_len", 16)
    sc = parse_scenario({"name": "t", "seed": 3, "workload": cfg})
    return Workload(sc.workload, sc.seed, TRACE)


def same_spec(a: RequestSpec, b: RequestSpec) -> bool:
    return (a.rid, a.arrival_s, a.output_len, a.shared_len, a.role, a.session, a.turn, a.prompt_len) == \
        (b.rid, b.arrival_s, b.output_len, b.shared_len, b.role, b.session, b.turn, b.prompt_len) and \
        a.prefix.tolist() == b.prefix.tolist() and a.suffix.tolist() == b.suffix.tolist()


@pytest.mark.parametrize("kw", [dict(kind="multi_agent"), dict(kind="multi_agent", turns=3),
                                dict(kind="azure"), dict(kind="control", arrivals="trace")])
def test_initial_specs_equal_the_list(kw):
    specs = workload(**kw).initial_specs()
    want = workload(**kw).initial()
    assert isinstance(specs, InitialSpecs) and len(specs) == len(want)
    assert specs.in_order()
    got = [specs[i] for i in range(len(specs))]
    assert all(same_spec(a, b) for a, b in zip(got, want))
    assert type(got[0].arrival_s) is float and type(got[0].output_len) is int
    with pytest.raises(IndexError):
        specs[len(specs)]


def test_the_queue_builds_each_spec_when_it_comes_up(monkeypatch):
    """Nothing is built up front: a spec is made when the queue pops it (fails if the queue
    reads the whole sequence, as the up-front list did)."""
    specs = workload(n=50).initial_specs()
    built = []
    orig = InitialSpecs.__getitem__
    monkeypatch.setattr(InitialSpecs, "__getitem__", lambda self, i: built.append(i) or orig(self, i))
    q = ArrivalQueue(specs)
    assert built == [] and len(q) == 50
    q.pop(), q.pop()
    assert built == [0, 1] and len(q) == 48


@settings(max_examples=40, deadline=None)
@given(pushes=st.lists(st.tuples(st.integers(0, 60), st.floats(0, 30, allow_nan=False)), max_size=30))
def test_queue_merges_pushed_specs_like_a_heap(pushes):
    """Follow-ups pushed while the initial arrivals are read come out in (time, rid) order, as from
    one heap of every spec (ties in time included)."""
    wl = workload(n=40, rate=2.0)
    lazy, heap = ArrivalQueue(wl.initial_specs()), ArrivalQueue(list(wl.initial_specs()))
    assert heap._seq is None and lazy._seq is not None
    base = wl.initial()[0]
    extra = {at: RequestSpec(1000 + k, t, base.prefix, np.zeros(2, np.int32), 1, 0)
             for k, (at, t) in enumerate(pushes)}  # pushed before the pop numbered ``at``
    times = [float(x) for x in wl.initial_specs().times[:5]]
    for k, t in enumerate(times):  # pushed times equal to initial ones: ties broken by rid
        extra.setdefault(100 + k, RequestSpec(2000 + k, t, base.prefix, np.zeros(2, np.int32), 1, 0))
    popped = 0
    while len(heap):
        for q in (lazy, heap):
            if popped in extra:
                q.push(extra[popped])
        assert lazy.next_time() == heap.next_time()
        a, b = lazy.pop(), heap.pop()
        assert (a.rid, a.arrival_s) == (b.rid, b.arrival_s)
        assert len(lazy) == len(heap)
        popped += 1
    assert len(lazy) == 0 and lazy.next_time() is None


@settings(max_examples=60, deadline=None)
@given(sorted_times=st.lists(st.floats(0, 50, allow_nan=False), max_size=30),
       ops=st.lists(st.one_of(st.just(None), st.floats(0, 50, allow_nan=False)), max_size=80))
def test_pending_times_act_as_one_heap(sorted_times, ops):
    """``PendingTimes`` (a sorted array behind a cursor plus a heap) answers ``first``, ``pop`` and its
    length as one heap of all the times does; None in ``ops`` pops, a number pushes."""
    p, heap = PendingTimes(), []
    assert p.can_take_sorted()
    srt = np.array(sorted(sorted_times), dtype=np.float64)
    p.take_sorted(srt)
    heap = [float(t) for t in srt]
    heapq.heapify(heap)
    for op in ops:
        if op is None:
            if heap:
                assert p.pop() == heapq.heappop(heap)
        else:
            p.push(op)
            heapq.heappush(heap, op)
        assert len(p) == len(heap) and bool(p) == bool(heap)
        if heap:
            assert p.first() == heap[0] and type(p.first()) is float
    while heap:
        assert p.pop() == heapq.heappop(heap)
    assert len(p) == 0 and p.can_take_sorted()


def test_unsorted_specs_fall_back_to_the_heap():
    wl = workload(n=10)
    specs = wl.initial_specs()
    specs.times = specs.times[::-1].copy()
    assert not specs.in_order()
    q = ArrivalQueue(specs)
    assert q._seq is None
    assert [q.pop().rid for _ in range(10)] == list(range(9, -1, -1))
