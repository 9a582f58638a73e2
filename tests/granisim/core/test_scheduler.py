"""The scheduler on hand-built states: a real small allocator, hand-made requests, one step at a time.

Every test was shown to fail with the bug its docstring names planted in
``granisim/core/scheduler.py`` or ``granisim/core/batching.py`` (then removed).
"""

from __future__ import annotations

import pytest

from granisim.core.contract import StepResult
from tests.granisim.core.states import new_tokens, rids, scheduler, spec, step


def add(s, *specs, now: float = 0.0) -> None:
    for sp in specs:
        s.add(sp, now)


def waiting(s) -> list[int]:
    return [r.rid for r in s.waiting]


def rejected(s) -> dict[int, str]:
    return {r.rid: r.reason for r in s.records if r.status == "rejected"}


# ---- admission ------------------------------------------------------------------------------------
def test_admission_is_first_come_first_served_up_to_max_running():
    """catches: admitting from the back of the queue; `<=` for `<` in the max_running limit."""
    s = scheduler(max_running=2)
    add(s, spec(1), spec(2), spec(3))
    plan = step(s)
    assert rids(plan) == [1, 2]
    assert waiting(s) == [3]
    assert list(s.running) == [1, 2]


def test_a_step_never_exceeds_the_token_budget_and_decodes_count_against_it():
    """Step 1: 60 + a 40-token chunk of the second prompt; step 2: one decode, the second prompt's last 20,
    then 79 of the third. catches: a chunk not capped by the budget; decodes not charged to the budget."""
    s = scheduler(max_batch_tokens=100)
    add(s, spec(1, prompt=60), spec(2, prompt=60), spec(3, prompt=200))
    first = step(s)
    assert new_tokens(first) == {1: 60, 2: 40}
    assert waiting(s) == [3]
    second = step(s)
    assert new_tokens(second) == {1: 1, 2: 20, 3: 79}
    assert [p.is_prefill for p in second.requests] == [False, True, True]
    for plan in (first, second):
        assert plan.num_tokens <= 100


def test_chunked_prefill_resumes_where_it_stopped_and_samples_only_at_the_end():
    """catches: a mid-prompt chunk samples a token (the request would decode after its first chunk)."""
    s = scheduler(max_batch_tokens=100)
    add(s, spec(1, prompt=250))
    seen = []
    for _ in range(4):
        p = step(s).requests[0]
        seen.append((p.context_len, p.num_new, p.is_prefill))
    assert seen == [(0, 100, True), (100, 100, True), (200, 50, True), (250, 1, False)]
    assert s.running[1].generated == 2


def test_a_request_whose_prefix_another_is_prefilling_waits_for_the_cache():
    """Request 2 shares role 1's prefix, which request 1 is computing in step 1: it is skipped (not
    computed twice), keeps its place before request 3, and is admitted in step 2 with the 32 prefix
    tokens cached. catches: no skip while the prefix owner prefills."""
    s = scheduler(max_running=8)
    add(s, spec(1, 4, role=1, prefix=32), spec(2, 4, role=1, prefix=32), spec(3, 4, role=2, prefix=32))
    first = step(s)
    assert rids(first) == [1, 3]
    second = step(s)
    assert new_tokens(second) == {1: 1, 3: 1, 2: 4}
    assert s.running[2].cached_at_admit == 32


@pytest.mark.parametrize("prefix, cached", [(38, 32), (5, 0)])
def test_requests_are_not_held_back_for_a_prefix_pages_cannot_hold_whole(prefix, cached):
    """paged16 caches whole pages of a role prefix only: 32 tokens of a 38-token one, none of a 5-token one.
    Requests 2-4 of the role wait only while request 1 prefills those pages, then are all admitted in one step
    (each hitting what is cached), not one a step, each waiting on the one before for tokens no page will
    hold. catches: the prefix owner judged on the whole declared prefix instead of its whole pages."""
    s = scheduler("paged16", max_running=8)
    add(s, *(spec(rid, 4, role=1, prefix=prefix) for rid in (1, 2, 3, 4)))
    first = step(s)
    assert rids(first) == ([1] if cached else [1, 2, 3, 4])
    if cached:
        second = step(s)
        assert new_tokens(second) == {1: 1, 2: prefix + 4 - cached, 3: prefix + 4 - cached, 4: prefix + 4 - cached}
    assert [s.running[r].cached_at_admit for r in (2, 3, 4)] == [cached] * 3


def test_prefix_groups_are_formed_per_step_from_decoding_members():
    """Step 3: requests 1 and 2 (role 1, both decoding) form one group over the 32-token slab; request 3
    (role 2, alone) and request 4 (no prefix) are in no group. catches: a lone request given a group;
    a group's M_eff without the GQA group size."""
    s = scheduler("granikv", 1000, hot_fraction=0.5, group_size=4)
    add(s, spec(1, 4, role=1, prefix=32), spec(2, 4, role=1, prefix=32), spec(3, 4, role=2, prefix=32), spec(4, 8))
    step(s)
    second = step(s)
    assert second.groups == ()  # request 2 is still prefilling its suffix
    plan = step(s)
    assert rids(plan) == [1, 3, 4, 2]
    (g,) = plan.groups
    assert (g.prefix_len, g.storage, g.members, g.m_eff) == (32, "slab", (0, 3), 8)
    assert [(p.group, p.shared_len) for p in plan.requests] == [(0, 32), (-1, 0), (-1, 0), (0, 32)]


def _grouped_pair(policy: str = "granikv", hot_fraction: float = 0.5, **kw):
    """Two decoding requests over one 32-token role prefix (group size 4: M_eff = 8)."""
    s = scheduler(policy, 1000, hot_fraction=hot_fraction, group_size=4, **kw)
    add(s, spec(1, 4, role=1, prefix=32), spec(2, 4, role=1, prefix=32))
    step(s), step(s)
    return step(s).groups


@pytest.mark.parametrize("m_sat, path", [(7, "dense"), (8, "dense"), (9, "cascade")])
def test_threshold_dispatch_around_m_sat_through_the_scheduler(m_sat, path):
    """M_eff = 2 members * G 4 = 8 above, at and below m_sat. catches: `>` for `>=`; m_sat compared
    with the member count instead of M_eff; the scheduler's m_sat not reaching the builder."""
    (g,) = _grouped_pair(m_sat=m_sat)
    assert (g.storage, g.path) == ("slab", path)


def test_a_prefix_outside_a_slab_never_takes_the_dense_kernel():
    """No HOT pool: the prefix sits in the cold pool, so cascade even with M_eff far above m_sat.
    catches: the threshold rule ignoring the storage."""
    (g,) = _grouped_pair(hot_fraction=0.0, m_sat=1)
    assert (g.storage, g.path) == ("cold", "cascade")


def test_baseline_policies_read_every_prefix_per_request():
    """catches: a prefix pass (dense or cascade) planned for a policy without one."""
    (g,) = _grouped_pair("token", m_sat=1)
    assert g.path == "paged"


# ---- preemption -----------------------------------------------------------------------------------
def test_retract_preempts_the_request_with_fewest_generated_tokens():
    """A (prompt 40) runs from step 1, B (10) from step 4, C (10) from step 6; step 8 needs 73 slots of 72.
    C has generated fewest (2, against A 7 and B 4) and is preempted (recompute), its slots freed; A and
    B decode. catches: victim chosen by most generated tokens; victim by longest prompt first."""
    s = scheduler(capacity=72)
    add(s, spec(1, prompt=40, out=20))
    for _ in range(3):
        step(s)
    add(s, spec(2, out=20))
    step(s), step(s)
    add(s, spec(3, out=20))
    step(s), step(s)
    assert [s.running[r].generated for r in (1, 2, 3)] == [7, 4, 2]
    plan = step(s)
    assert rids(plan) == [1, 2]
    assert waiting(s) == [3] and s.waiting[0].computed == 0 and s.waiting[0].preemptions == 1
    assert s.preemptions == 1


def _tie(order: str, capacity: int = 263, extra=None):
    """A (prompt 250) and B (10), admitted in order in one step, have generated the same when step 3 needs
    264 slots of 263."""
    s = scheduler(capacity=capacity, max_running=2, preempt_order=order)
    add(s, spec(1, prompt=250, out=10), spec(2, out=10))
    step(s), step(s)
    if extra is not None:
        add(s, extra)
    assert s.running[1].generated == s.running[2].generated == 2
    return s, step(s)


def test_retract_breaks_a_tie_by_the_longest_prompt():
    """catches: tie broken by the shortest prompt (or by admission order, as LIFO would)."""
    s, plan = _tie("retract")
    assert rids(plan) == [2] and waiting(s) == [1]


def test_lifo_preempts_the_last_admitted():
    """catches: LIFO taking the first admitted request."""
    s, plan = _tie("lifo")
    assert rids(plan) == [1] and waiting(s) == [2]


def test_a_preempted_request_goes_back_to_the_front_of_the_queue():
    """D arrived before A was preempted, and would fit; A goes back in front of it, so D still waits.
    catches: a preempted request appended at the back of the queue."""
    s, plan = _tie("retract", extra=spec(4, prompt=5))
    assert rids(plan) == [2]
    assert waiting(s) == [1, 4]


# ---- rejections -----------------------------------------------------------------------------------
def test_a_request_larger_than_the_whole_budget_is_rejected_on_arrival():
    """prompt 990 + 20 outputs > 1000 tokens. catches: only the prompt compared with the budget."""
    s = scheduler(capacity=1000)
    add(s, spec(1, prompt=990, out=20), spec(2, prompt=990, out=10))
    assert rejected(s) == {1: "needs 1010 KV tokens; the token budget holds 1000 for one request"}
    assert waiting(s) == [2]


def test_a_request_that_cannot_fit_even_alone_is_rejected_at_admission():
    """granikv, 100 tokens, half HOT: a 60-token prompt without a shared prefix must go to the 50-token cold
    pool. catches: such a request put back at the front (it would block the queue forever)."""
    s = scheduler("granikv", 100, hot_fraction=0.5)
    add(s, spec(1, prompt=60, out=10), spec(2, prompt=20))
    plan = step(s)
    assert rids(plan) == [2]
    assert rejected(s) == {1: "does not fit the granikv KV budget even alone (70 KV tokens, 0 of them a shared "
                              "prefix; COLD holds 50, HOT 50 for shared prefixes only)"}


def test_arrivals_beyond_max_waiting_are_rejected():
    """catches: `>` for `>=` in the queue limit (one extra request queued)."""
    s = scheduler(max_waiting=2)
    add(s, spec(1), spec(2), spec(3), now=0.5)
    assert waiting(s) == [1, 2]
    assert rejected(s) == {3: "queue full (2 waiting)"}
    (rec,) = [r for r in s.records if r.rid == 3]
    assert rec.finish_s == 0.5


def test_queue_timeout_rejects_only_requests_that_never_started():
    """Waiting A was preempted after it started: it is never expired. C waited exactly the timeout: kept.
    catches: a preempted request expired; `>=` for `>` at the timeout."""
    s, _ = _tie("retract")
    s.cfg = s.cfg.model_copy(update={"queue_timeout_s": 5.0})
    add(s, spec(3, arrival=1.0), spec(4, arrival=2.0), now=2.0)
    assert s.next_expiry() == 6.0  # C's deadline; A has none
    s.expire(6.0)
    assert rejected(s) == {} and waiting(s) == [1, 3, 4]
    s.expire(6.5)
    assert rejected(s) == {3: "waited over queue_timeout_s=5.0"}
    assert waiting(s) == [1, 4] and s.next_expiry() == 7.0


def test_no_queue_timeout_means_no_expiry():
    """catches: queue_timeout_s = 0 read as 'expire at once'."""
    s = scheduler()
    add(s, spec(1))
    assert s.next_expiry() is None
    s.expire(1e9)
    assert waiting(s) == [1]


# ---- tenancy-aware admission ----------------------------------------------------------------------
def _tenancy(**kw):
    """X (role 1) decodes with its prefix cached; then W2 (role 2, t=1), W1 (role 1, t=2), W3 (role 3,
    t=3) wait; one slot is free at t=3. Returns the request admitted then and the queue after."""
    s = scheduler(max_running=2, **kw)
    add(s, spec(9, 4, out=50, role=1, prefix=32))
    step(s)
    add(s, spec(2, 4, arrival=1.0, role=2, prefix=32), spec(1, 4, arrival=2.0, role=1, prefix=32),
        spec(3, 4, arrival=3.0, role=3, prefix=32), now=3.0)
    plan = step(s, now=3.0)
    (admitted,) = [p.rid for p in plan.requests if p.is_prefill]
    return s, admitted


def test_fcfs_admits_in_arrival_order():
    """catches: the tenancy-aware reordering applied under admission = "fcfs" too."""
    s, admitted = _tenancy(admission="fcfs")
    assert admitted == 2 and waiting(s) == [1, 3]


def test_prefix_admission_takes_the_waiter_whose_prefix_is_held_first():
    """W1's role prefix is held by the running X: W1 goes first and hits the cache; the others keep their
    arrival order. catches: warm roles taken from the waiting queue instead of the running requests."""
    s, admitted = _tenancy(admission="prefix")
    assert admitted == 1 and s.running[1].cached_at_admit == 32
    assert waiting(s) == [2, 3]


@pytest.mark.parametrize("max_wait, first", [(1.5, 2), (2.0, 1)])
def test_prefix_admission_ages_old_waiters_to_the_front(max_wait, first):
    """W2 has waited 2 s at t=3: aged past 1.5 s it goes first; at exactly 2.0 s it is not yet aged.
    catches: aging ignored; `>=` for `>` in the aging test."""
    _, admitted = _tenancy(admission="prefix", admission_max_wait_s=max_wait)
    assert admitted == first


# ---- decode fast-forward --------------------------------------------------------------------------
def _decoding(capacity: int = 10_000, outs=(6, 10), **kw):
    """Two requests (prompt 10) past their prefill; returns the scheduler and the next decode plan."""
    s = scheduler(capacity=capacity, **kw)
    add(s, *(spec(i + 1, out=o) for i, o in enumerate(outs)))
    step(s)
    return s, s.schedule(0.0)


def test_fast_forward_stops_at_the_first_request_to_finish():
    """Remaining outputs 5 and 9: 5 steps; applied at once, request 1 completes with exactly its 6 tokens.
    catches: the longest remaining output taken (request 1 would run past its end)."""
    s, plan = _decoding()
    k = s.fast_forward_limit(plan)
    assert k == 5
    s.extend_plan(plan, k)
    done = s.postprocess(plan, StepResult(0.0), 0.0, steps=k)
    assert [r.rid for r in done] == [1] and done[0].generated == 6
    assert s.running[2].generated == 6


def test_fast_forward_stays_within_free_memory():
    """42 slots, 22 used after the plan: 20 free hold 9 more steps for 2 requests (less a page of margin);
    extending by them needs no preemption. catches: the free-memory limit left out."""
    s, plan = _decoding(capacity=42, outs=(30, 30))
    assert s.alloc.available() == 20
    k = s.fast_forward_limit(plan)
    assert k == 9
    s.extend_plan(plan, k)
    assert s.alloc.available() == 4


def test_no_fast_forward_when_disabled_or_with_a_prefill_in_the_step():
    """catches: the fast_forward switch ignored; a plan with a prefill chunk fast-forwarded."""
    s, plan = _decoding(fast_forward=False)
    assert s.fast_forward_limit(plan) == 1
    s = scheduler(max_batch_tokens=12)
    add(s, spec(1, out=50), spec(2, prompt=20, out=50))
    step(s)
    plan = s.schedule(0.0)
    assert [p.is_prefill for p in plan.requests] == [False, True]
    assert s.fast_forward_limit(plan) == 1
