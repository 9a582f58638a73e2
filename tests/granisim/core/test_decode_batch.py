"""DecodeBatch (the scheduler's decoding requests on one clock) against plain per-request counters.

Random lives: requests join (mostly in admission order, sometimes earlier-admitted ones later), leave,
take decode steps together (never past the first finish, as the scheduler's fast-forward limit
ensures) and special members (declared prefix not cached) are stepped one by one and promoted. After
every operation each member's counters, the running order, the context column, the fewest outputs
left, the outstanding reserve and the finishers a step returns must equal those of a reference that
steps every request itself.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from granisim.core.decode_batch import DecodeBatch
from granisim.core.request import Request
from granisim.core.workload import RequestSpec

RATIO = 0.37

_op = st.one_of(
    st.tuples(st.just("join"), st.integers(1, 40), st.integers(0, 30), st.booleans(), st.booleans()),
    st.tuples(st.just("leave"), st.integers(0, 100)),
    st.tuples(st.just("step"), st.integers(1, 8)),
    st.tuples(st.just("promote"), st.integers(0, 100)),
)


def _request(rid: int, order: int, out: int, gen: int, special: bool) -> Request:
    r = Request(RequestSpec(rid, 0.0, np.arange(8, dtype=np.int32), np.arange(4, dtype=np.int32), out,
                            8 if special else 0))
    r.admit_order = order
    r.computed = r.prompt_len + gen
    r.n_tokens = r.prompt_len + gen + 1
    r.generated = gen + 1
    r.decoding = True
    return r


def _check(batch: DecodeBatch, ref: list[Request], want: dict[int, tuple[int, int, int]]) -> None:
    assert list(batch) == [r.rid for r in ref]
    assert [r.rid for r in batch.values()] == [r.rid for r in ref]
    decode, rids = batch.members()
    assert [r.rid for r in decode] == rids == [r.rid for r in ref]
    for r in ref:
        assert (r.computed, r.n_tokens, r.generated) == want[r.rid]
    ctx = batch.contexts()
    assert ctx.tolist() == [want[r.rid][0] for r in ref]
    if ref:
        assert (ctx.sum, ctx.max) == (sum(ctx.tolist()), max(ctx.tolist()))
    left = [r.output_len - want[r.rid][2] for r in ref]
    assert batch.min_remaining() == (min(left) if left else None)
    plain = [r for r in ref if r.rid not in batch.special]
    exact = sum(int(RATIO * (r.output_len - want[r.rid][2])) + 1 for r in plain)
    assert batch.outstanding(RATIO) == exact
    assert exact <= batch.outstanding_bound(RATIO) <= exact + len(plain) + 1


def _life(ops):
    batch, ref, want = DecodeBatch(), [], {}
    rid = order = 0
    used = set()  # admit orders are unique per request, as the scheduler's counter makes them (a member that
    # left stays in the batch's heap until popped, so a new member must not take its order)
    for op in ops:
        if op[0] == "join":
            _, out, gen, early, special = op
            gen = min(gen, out - 2)
            if gen < 0:
                continue
            order += 1
            o = order - 2 * len(ref) if early and ref else order  # sometimes earlier than members
            if o in used:
                o = order
            used.add(o)
            r = _request(rid, o, out, gen, special)
            rid += 1
            want[r.rid] = (r.computed, r.n_tokens, r.generated)
            batch.join(r)
            ref.append(r)
            ref.sort(key=lambda q: q.admit_order)
        elif op[0] == "leave" and ref:
            r = ref.pop(op[1] % len(ref))
            batch.leave(r)
            assert r._clock is None and (r.computed, r.n_tokens, r.generated) == want[r.rid]
        elif op[0] == "promote" and batch.special:
            r = list(batch.special.values())[op[1] % len(batch.special)]
            r.prefix_cached = True
            batch.promote(r)
        elif op[0] == "step" and ref:
            steps = min(op[1], min(r.output_len - want[r.rid][2] for r in ref))
            special = list(batch.special.values())
            due = batch.advance(steps)
            for r in special:  # what Scheduler._apply does to a special member's counters
                r.computed += steps
                r.n_tokens += steps
                r.generated += steps
            for r in ref:
                c, n, g = want[r.rid]
                want[r.rid] = (c + steps, n + steps, g + steps)
            assert [r.rid for r in due] == [r.rid for r in ref if r not in special
                                            and want[r.rid][2] >= r.output_len]
            for r in due:  # the scheduler finishes them
                batch.leave(r)
                ref.remove(r)
        _check(batch, ref, want)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=80))
def test_batch_steps_as_every_request_stepping_itself(ops):
    """Planted bugs this catches (each tried): ``leave`` dropping the wrong context key (off by one);
    the outstanding reserve without the members' one held token, and its bound without them; ``promote`` forgetting to put the
    member on the clock (its counters stop); an out-of-order join appended at the end; ``members()`` kept
    across a join or a leave."""
    _life(ops)


def test_a_step_past_a_last_output_is_refused():
    """The scheduler never steps a member past its last output; a batch asked to fails loudly rather
    than finish it late."""
    batch = DecodeBatch()
    batch.join(_request(0, 0, 5, 0, False))  # 4 outputs left
    with pytest.raises(ValueError, match="pass request 0"):
        batch.advance(5)


def test_rebuild_after_counters_changed_one_by_one():
    """A step with real tokens changes members' counters one at a time; after ``rebuild`` the batch
    reads them as they are, and members not changed keep the clock's steps. Planted bug caught:
    rebuild taking members off the clock without catching them up first."""
    batch = DecodeBatch()
    rs = [_request(i, i, 20, i, False) for i in range(4)]
    for r in rs:
        batch.join(r)
    batch.advance(2)
    rs[0].computed += 1
    rs[0].n_tokens += 1
    rs[0].generated += 1
    batch.rebuild()
    assert batch.contexts().tolist() == [r.prompt_len + i + 2 + (i == 0) for i, r in enumerate(rs)]
    assert batch.min_remaining() == 20 - (3 + 3)


def test_kept_group_sums_price_as_the_rows_do(monkeypatch):
    """Every plan of a multi-agent run (prefix groups forming and dissolving, lone decode rows, prefill
    rows) gives the same integer sums from the decode batch's kept group sums as from its rows. Planted
    bugs caught (each tried): a member's suffix counted without its one new token, the lone rows'
    longest context taken over every group, a group's stale maximum not found again."""
    from granisim.core.planned import PlannedRequests
    from granisim.core.scheduler import Scheduler
    from granisim.costmodel import step
    from tests.granisim.simhelpers import run, small

    seen = {"kept": 0}
    build = Scheduler.schedule

    def checked(s, now):
        plan = build(s, now)
        cols = plan.requests if plan is not None else None
        if isinstance(cols, PlannedRequests) and plan.groups and cols.decode_groups is not None:
            kept = step._kept_group_sums(cols, plan.groups, cols.n_decode)
            rows = PlannedRequests(cols.rid, list(cols.context_len), cols.num_new, cols.is_prefill, cols.group,
                                   cols.shared_len, n_decode=cols.n_decode)
            assert kept == step._grouped_rows(rows, plan.groups)
            seen["kept"] += kept is not None
        return plan

    monkeypatch.setattr(Scheduler, "schedule", checked)
    run(small(**{"workload.roles": 4, "workload.num_requests": 120, "workload.rate": 40.0,
                 "hardware.kv_budget_tokens": 30000}))
    assert seen["kept"] > 50
