"""A plan's requests as columns: the same requests as the tuple, the same prices, the same results."""

import random

import numpy as np
import pytest

from granisim.config.hardware import get_profile
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup
from granisim.core.planned import PlannedRequests, columns
from granisim.costmodel import step_cost
from granisim.costmodel import step as step_module

A100 = get_profile("a100-80gb")
LLAMA = get_model("llama-3.1-8b")


def random_requests(rng, n, groups=0):
    out = []
    for rid in range(n):
        if rng.random() < 0.2:
            out.append(PlannedRequest(rid, rng.randrange(0, 4000), rng.randrange(1, 600), True))
        elif groups and rng.random() < 0.6:
            shared = 64 * (1 + rid % groups)
            out.append(PlannedRequest(rid, shared + rng.randrange(1, 900), 1, False, rid % groups, shared))
        else:
            out.append(PlannedRequest(rid, rng.randrange(1, 9000), 1, False))
    return tuple(out)


def grouped(reqs, paths):
    """``reqs`` with their group numbers renumbered to index the groups returned with them."""
    members = {}
    for i, r in enumerate(reqs):
        if r.group >= 0:
            members.setdefault(r.group, []).append(i)
    number = {g: k for k, g in enumerate(sorted(members))}
    reqs = tuple(PlannedRequest(r.rid, r.context_len, r.num_new, r.is_prefill, number[r.group], r.shared_len)
                 if r.group >= 0 else r for r in reqs)
    return reqs, tuple(PrefixGroup(g, reqs[members[g][0]].shared_len, "slab", paths[k % len(paths)],
                                   tuple(members[g]), 4 * len(members[g])) for g, k in number.items())


@pytest.mark.parametrize("seed", range(20))
def test_columns_are_the_requests(seed):
    rng = random.Random(seed)
    reqs = random_requests(rng, rng.randrange(0, 40), groups=3)
    cols = columns(reqs)
    assert isinstance(cols, PlannedRequests) and columns(cols) is cols
    assert len(cols) == len(reqs) and tuple(cols) == reqs and list(cols) == list(reqs)
    assert all(cols[i] == r for i, r in enumerate(reqs)) and cols[1:5] == reqs[1:5]
    assert cols == reqs and hash(cols) == hash(reqs)
    assert cols + reqs == reqs + reqs and reqs + cols == reqs + reqs
    if reqs:
        other = reqs[:-1] + (PlannedRequest(reqs[-1].rid, reqs[-1].context_len + 1, reqs[-1].num_new,
                                            reqs[-1].is_prefill, reqs[-1].group, reqs[-1].shared_len),)
        assert cols != other and cols != columns(other)


def _price(reqs, groups=(), steps=1):
    plan = BatchPlan(0, "granikv", 1, reqs, groups, num_steps=steps)
    return step_cost(plan, A100, LLAMA)


@pytest.mark.parametrize("seed", range(30))
def test_column_sums_price_as_the_row_loop(seed, monkeypatch):
    """Ungrouped plans are priced by sums over the columns; the per-row loop (the sums turned off) gives
    the same result, bit for bit, for tuples and columns, mixed and decode-only, fast-forwarded or not.
    Planted bug: a decode row of ``num_new`` 2 counted as a decode (the loop prices it as prefill)."""
    rng = random.Random(seed)
    reqs = random_requests(rng, rng.randrange(1, 60))
    if seed % 3 == 0:
        reqs = tuple(r for r in reqs if not r.is_prefill) or (PlannedRequest(0, 5, 1, False),)
    if seed % 5 == 1:  # a non-prefill row computing two tokens: priced as the loop prices it
        r = reqs[0]
        reqs = (PlannedRequest(r.rid, r.context_len, 2, False),) + reqs[1:]
    steps = rng.randrange(2, 9) if all(not r.is_prefill and r.num_new == 1 for r in reqs) else 1
    fast = [_price(reqs, steps=steps), _price(columns(reqs), steps=steps)]
    monkeypatch.setattr(step_module, "_ungrouped_rows", lambda cols: None)
    slow = [_price(reqs, steps=steps), _price(columns(reqs), steps=steps)]
    assert fast == slow
    assert fast[0].duration_s == slow[0].duration_s and fast[0].step_durations == slow[0].step_durations


@pytest.mark.parametrize("seed", range(10))
def test_grouped_plans_price_the_same_as_columns(seed):
    rng = random.Random(seed)
    reqs = random_requests(rng, rng.randrange(8, 50), groups=3)
    reqs, groups = grouped(reqs, ("paged", "cascade", "dense"))
    assert groups
    assert _price(reqs, groups) == _price(columns(reqs), groups)


def test_with_steps_is_replace():
    """Every field of the plan but num_steps carried over (a field added to BatchPlan and not to
    with_steps fails here)."""
    import dataclasses

    from granisim.core.contract import with_steps
    from granisim.kv.hot_pool import KVCopy

    plan = BatchPlan(7, "granikv", 16, random_requests(random.Random(0), 5), (), (KVCopy(1, 2, 3),), 1, ("t",))
    assert set(f.name for f in dataclasses.fields(BatchPlan)) == {
        "step", "policy", "page_size", "requests", "groups", "copies", "num_steps", "transfers"}
    assert with_steps(plan, 4) == dataclasses.replace(plan, num_steps=4)


def _decode_first(rng, n):
    """Requests in the batch builder's order: decode rows (one token each), then prefill rows."""
    reqs = random_requests(rng, n)
    dec = [r for r in reqs if not r.is_prefill]
    pre = [r for r in reqs if r.is_prefill]
    if pre:  # a prefill row with the longest context (a decode row's longest context leaves it out)
        r = pre[-1]
        pre[-1] = PlannedRequest(r.rid, max(q.context_len for q in reqs) + 100, r.num_new, True)
    return tuple(dec + pre), len(dec)


def _hinted(reqs, n_decode):
    c = columns(reqs)
    return PlannedRequests(c.rid, c.context_len, c.num_new, c.is_prefill, c.group, c.shared_len, n_decode=n_decode)


@pytest.mark.parametrize("profile", ["a100-80gb", "h200", "h200-engine"])  # attn.form 1, 2, 2 + engine fit
@pytest.mark.parametrize("seed", range(30))
def test_decode_first_columns_price_and_log_as_without_the_hint(seed, profile, monkeypatch):
    """Columns that say their first ``n_decode`` rows are the decode rows (the batch builder's) are the
    same requests, priced bit for bit as without the hint and as by the row loop, and logged alike.
    Planted bugs caught: the hinted sums leaving out the decode rows' tokens from T, or taking the
    longest context over every row instead of the decode rows (attn.form 2 reads it)."""
    from granisim.core.metrics import StepLog
    from granisim.kv.allocator import make_allocator

    rng = random.Random(seed)
    reqs, nd = _decode_first(rng, rng.randrange(1, 60))
    if seed % 4 == 0:  # decode-only
        reqs = reqs[:nd] or (PlannedRequest(0, 5, 1, False),)
        nd = len(reqs)
    hinted = _hinted(reqs, nd)
    assert hinted == reqs and hinted == columns(reqs)
    steps = rng.randrange(2, 9) if nd == len(reqs) else 1
    hw = get_profile(profile)

    def price(r):
        return step_cost(BatchPlan(0, "granikv", 1, r, (), num_steps=steps), hw, LLAMA)

    fast = price(hinted)
    assert fast == price(columns(reqs))
    logs = []
    for plan_reqs in (hinted, columns(reqs)):
        log = StepLog()
        log.record(0.0, BatchPlan(3, "granikv", 1, plan_reqs, (), num_steps=steps), fast,
                   make_allocator("granikv", 1000))
        logs.append(log._log.row(0))
    assert logs[0] == logs[1]
    monkeypatch.setattr(step_module, "_ungrouped_rows", lambda cols: None)
    assert fast == price(reqs)


@pytest.mark.parametrize("profile", ["a100-80gb", "h200", "h200-engine"])
@pytest.mark.parametrize("seed", range(12))
def test_first_steps_of_a_block_are_the_plan_priced_for_them(seed, profile):
    """A fast-forwarded plan's first ``k`` steps, taken from its priced block (what the cost executor
    does when an event cuts a block short), equal the plan priced with ``num_steps = k``, bit for bit,
    grouped or not, with KV copies or not; the executor gives the same through either path.
    Planted bug caught: the first steps' decode time summed over the whole block."""
    from granisim.core.contract import with_steps
    from granisim.costmodel import cost_tables
    from granisim.costmodel.executor import CostExecutor
    from granisim.costmodel.host_build import with_rebuild

    rng = random.Random(seed)
    hw = get_profile(profile)
    reqs, groups, copies = _decode_batch(rng, seed)
    n = rng.randrange(3, 40)
    plan = BatchPlan(5, "granikv", 1, columns(reqs), groups, copies, num_steps=n)
    tables = cost_tables(hw, LLAMA)
    whole, block = tables.step_block(plan)

    def priced(r):  # the first step's full build on an engine profile (granisim.costmodel.host_build)
        return with_rebuild(r, tables.rebuild) if tables.rebuild else r

    whole = priced(whole)
    assert whole == step_cost(plan, hw, LLAMA) and len(block) == n
    ex = CostExecutor(hw, LLAMA)
    assert ex.execute(plan) == whole
    for k in sorted(rng.sample(range(2, n + 1), min(6, n - 1)), reverse=True):
        direct = step_cost(with_steps(plan, k), hw, LLAMA)
        assert priced(block.first(k)) == direct
        if k < n:  # the block cut short (the same plan again would be a step after it)
            assert ex.execute(with_steps(plan, k)) == direct
        assert direct.step_durations == whole.step_durations[:k]


@pytest.mark.parametrize("seed", range(16))
def test_a_short_block_on_floats_is_the_block_on_arrays(seed, monkeypatch):
    """Fast-forward blocks of up to SHORT_BLOCK steps are priced step by step on floats
    (``StepPricing._short_block``, form 1 without engine scaling): the result and the block's
    per-step parts equal the array expressions' bit for bit (SHORT_BLOCK = 0 forces them), grouped
    or not, with KV copies or not. Shown to catch planted bugs: the KV copies
    added to every step, and the host time's per-pass term left out."""
    from granisim.costmodel import cost_tables

    rng = random.Random(seed)
    hw = get_profile("a100-80gb")
    reqs, groups, copies = _decode_batch(rng, seed)
    tables = cost_tables(hw, LLAMA)
    # a100-80gb prices no host overhead per token or per pass: give it h200-engine's, so the host terms count
    engine = cost_tables(get_profile("h200-engine"), LLAMA)
    for k in ("step_overhead", "overhead_req", "overhead_tok", "overhead_pass"):
        monkeypatch.setattr(tables, k, getattr(engine, k))  # the tables are cached: put back after the test
    for n in sorted({2, 3, rng.randrange(2, step_module.SHORT_BLOCK + 1), step_module.SHORT_BLOCK}):
        plan = BatchPlan(5, "granikv", 1, columns(reqs), groups, copies, num_steps=n)
        short, sblock = tables.step_block(plan)
        with monkeypatch.context() as m:
            m.setattr(step_module, "SHORT_BLOCK", 0)
            want, wblock = tables.step_block(plan)
        assert short == want
        for part in ("steps", "dec", "host"):
            assert list(getattr(sblock, part)) == getattr(wblock, part).tolist()
        assert sblock.fixed == wblock.fixed and sblock.kv_copy == wblock.kv_copy


def _decode_batch(rng, seed):
    """A random decode batch of 1-39 requests: grouped for odd seeds, with a KV copy for seeds divisible by 3."""
    from granisim.kv.hot_pool import KVCopy

    reqs = tuple(r for r in random_requests(rng, rng.randrange(2, 40), groups=3) if not r.is_prefill)
    reqs = reqs or (PlannedRequest(0, 5, 1, False),)
    groups = ()
    if seed % 2:
        reqs, groups = grouped(reqs, ("paged", "cascade", "dense"))
    copies = (KVCopy(0, 64, 16),) if seed % 3 == 0 else ()
    return reqs, groups, copies


@pytest.mark.parametrize("seed", range(8))
def test_numpy_sum_adds_a_list_as_numpy_adds_the_array(seed):
    """``numpy_sum`` (a short block's breakdown sums, on lists) equals ``np.add.reduce`` bit for bit at
    every length up to 300, on values of very different sizes (where the order of additions shows).
    Shown to catch planted bugs: a plain left-to-right sum, and halves not cut at a multiple of 8."""
    rng = random.Random(seed)
    for n in range(301):
        xs = [rng.random() * 10.0 ** rng.randrange(-9, 5) for _ in range(n)]
        assert step_module.numpy_sum(xs) == float(np.add.reduce(np.array(xs, dtype=float))), n


@pytest.mark.parametrize("profile", ["a100-80gb", "h200", "h200-engine"])
@pytest.mark.parametrize("seed", range(24))
def test_grouped_decode_first_columns_price_as_the_row_loop(seed, profile):
    """Decode-first columns with prefix groups (``_grouped_rows``: sums a group at a time) price bit for
    bit as the same requests without the hint (the row loop), with and without ungrouped decode rows and
    prefill rows, one step or a block; a plan with a ``paged`` group keeps the loop.
    Planted bugs caught: a member's prefix left in the tokens read, the longest suffix taken over
    the whole contexts, and the ungrouped rows' longest context left out."""
    rng = random.Random(seed)
    reqs = random_requests(rng, rng.randrange(4, 70), groups=rng.randrange(1, 5))
    dec = [r for r in reqs if not r.is_prefill]
    pre = [r for r in reqs if r.is_prefill] if seed % 3 else []
    if seed % 4 == 0:  # every decode row in a group
        dec = [r for r in dec if r.group >= 0] or dec
    paths = [("cascade",), ("dense", "cascade"), ("cascade", "paged")][seed % 3]
    ordered, groups = grouped(tuple(dec + pre), paths)
    groups = tuple(g for g in groups if len(g.members) >= 2)
    keep = {i for g in groups for i in g.members}
    number = {g.members: k for k, g in enumerate(groups)}
    renum = {i: number[g.members] for g in groups for i in g.members}
    ordered = tuple(PlannedRequest(r.rid, r.context_len, r.num_new, r.is_prefill, renum[i], r.shared_len)
                    if i in keep else PlannedRequest(r.rid, r.context_len, r.num_new, r.is_prefill)
                    for i, r in enumerate(ordered))
    steps = rng.randrange(2, 9) if not pre else 1
    hw = get_profile(profile)

    def price(r):
        return step_cost(BatchPlan(0, "granikv", 1, r, groups, num_steps=steps), hw, LLAMA)

    assert price(_hinted(ordered, len(dec))) == price(columns(ordered))
