"""KVAllocator.grow (decode slots counted now, ids picked when read) against extend_all.

Two allocators get the same random life cycles (admit, prefill chunks, prefix caching, batched
decode steps, finish, preempt); one grows its decode batches with ``grow``, the other with
``extend_all``. Every count the simulator reads (free, cached, used, evictions, hits, stats) and
every radix node's tokens, lock and LRU stamp must agree after every operation, and the growing
allocator's slots, once settled, must each have exactly one owner or be free.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from granisim.kv import make_allocator
from granisim.kv.reserve import LazyReserve

CAP = 400
PREFIXES = [np.arange(k * 1000, k * 1000 + 48, dtype=np.int64) for k in range(3)]


def _nodes(alloc):
    """Every node's tokens, pool, lock count, LRU rank (the radix clock is shared by all indexes) and size."""
    nodes = list(alloc.radix.nodes())
    rank = {t: i for i, t in enumerate(sorted({n.last_access for n in nodes}))}
    return sorted((n.key.tolist(), n.pool, n.lock_ref, rank[n.last_access], len(n.value)) for n in nodes)


def _counts(alloc):
    return (alloc.occupancy(), alloc.available(), alloc.hit_rate, dict(alloc.radix.evictable), alloc.stats(),
            sorted(alloc.live_requests()), {r: alloc.num_tokens(r) for r in alloc.live_requests()})


def _check_ownership(alloc):
    """Every slot of every pool: free, or owned by exactly one request or node."""
    free = alloc.free_slots()  # settles every owed slot first
    bounds = alloc.pool_bounds()
    for name, (lo, hi) in bounds.items():
        owned = [s for kind, _, pool, s in alloc.ownership() if pool == name]
        every = np.concatenate([free[name], *owned]) if owned else free[name]
        assert np.array_equal(np.sort(every), np.arange(lo, hi)), name


def _prompt(kind, rid, n):
    suffix = np.arange(n, dtype=np.int64) + 100_000 + rid * 500
    return (np.concatenate([PREFIXES[kind], suffix]), PREFIXES[kind].size) if kind < 3 else (suffix, 0)


_op = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 3), st.integers(1, 80)),
    st.tuples(st.just("prefill"), st.integers(0, 50), st.integers(1, 64)),
    st.tuples(st.just("decode"), st.integers(1, 4)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("preempt"), st.integers(0, 50)),
)


def _life(policy, ops, hot_fraction=0.25, tracked=False):
    """Replay ``ops`` on a grow() allocator ``a`` and another ``b``; compare after each op. ``b`` grows
    with extend_all(), or with ``tracked`` as the scheduler does: every request tracked from its first
    decode step to its release, every decode step growing every decoding request by grow_tracked(),
    and can_admit asked with the reserve as a LazyReserve (a bound, the exact value on demand)."""
    a = make_allocator(policy, CAP, hot_fraction=hot_fraction)
    b = make_allocator(policy, CAP, hot_fraction=hot_fraction)
    reqs = {}  # rid -> [tokens, shared, done, limit]
    rid = 0
    for op in ops:
        if op[0] == "admit":
            tokens, shared = _prompt(op[1], rid, op[2])
            total = np.concatenate([tokens, np.arange(60, dtype=np.int64) + 900_000 + rid * 100])
            reserve, slack = ((rid * 131) % 390, rid % 50) if tracked else (0, 0)
            fits = a.can_admit(tokens, shared, reserve)  # (it notes demand: adaptive HOT)
            assert fits == b.can_admit(tokens, shared, LazyReserve(reserve + slack, lambda: reserve)
                                       if tracked else reserve)
            if fits:
                done = a.admit(rid, tokens, shared)
                assert b.admit(rid, tokens, shared) == done
                reqs[rid] = [total, shared, done, tokens.size]
            rid += 1
        elif op[0] == "prefill":
            todo = sorted(r for r, q in reqs.items() if q[2] < q[3])
            if not todo:
                continue
            r = todo[op[1] % len(todo)]
            q = reqs[r]
            n = min(op[2], q[3] - q[2])
            fits = a.can_extend({r: n})
            assert fits == b.can_extend({r: n})
            if not fits:
                continue
            a.extend(r, n)
            b.extend(r, n)
            q[2] += n
            if q[1] and q[2] >= q[1]:
                a.cache_prefix(r, q[0][: q[1]])
                b.cache_prefix(r, q[0][: q[1]])
            if tracked and q[2] == q[3]:  # its prompt is computed: it decodes from now on
                b.track(r)
        elif op[0] == "decode":
            n = op[1]
            decoding = sorted(r for r, q in reqs.items() if q[2] >= q[3])
            rids = [r for r in decoding if reqs[r][2] + n <= reqs[r][0].size]
            if not rids or (tracked and rids != decoding):
                continue
            fits = a.can_grow(rids, n)
            assert fits == (b.can_grow(rids, n) if tracked else b.can_extend_all(rids, n))
            if not fits:
                continue
            a.grow(rids, n)
            b.grow_tracked(rids, n) if tracked else b.extend_all(rids, n)
            for r in rids:
                reqs[r][2] += n
        elif reqs:
            r = sorted(reqs)[op[1] % len(reqs)]
            q = reqs.pop(r)
            for x in (a, b):
                x.release(r, q[0][: q[2]]) if op[0] == "finish" else x.release(r)
        if not (tracked and op[0] == "decode"):  # (reading counts catches a tracked request up: let some lag)
            assert _counts(a) == _counts(b), op
            assert _nodes(a) == _nodes(b), op
    _check_ownership(a)
    _check_ownership(b)
    assert _counts(a) == _counts(b)


@pytest.mark.parametrize("policy,hot", [("granikv", 0.25), ("token", 0.2), ("paged16", 0.2), ("paged1", 0.2),
                                        ("granikv", "adaptive")])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=60))
def test_grow_counts_as_extend_all_does(policy, hot, ops):
    """Planted bugs this catches (granikv and token fail; paged and adaptive HOT take extend_all's
    path): grow() not adding to n_new (token counts and what a finish caches differ), or owing one
    slot fewer than it grows (free counts differ)."""
    _life(policy, ops, hot)


def test_grow_counts_slots_without_picking_them_then_settles_on_read():
    """A decode batch grown by 3 takes 3 slots per request from the free count at once; their ids
    are picked on the first read of the request's slots (its layout), and every slot keeps one
    owner."""
    a = make_allocator("token", CAP)
    for r in range(4):
        a.admit(r, np.arange(10, dtype=np.int64) + 100 * r)
        a.extend(r, 10)
    free = a.store.free
    a.grow(list(range(4)), 3)
    assert a.store.free == free - 12 and a.store.pool._owed == 12
    assert a.num_tokens(0) == 13
    assert a.layout(0).num_tokens == 13 and a.store.pool._owed == 9
    _check_ownership(a)
    assert a.store.pool._owed == 0 and a.store.free == free - 12


@pytest.mark.parametrize("policy,hot", [("granikv", 0.25), ("token", 0.2), ("paged16", 0.2), ("paged1", 0.2),
                                        ("granikv", "adaptive")])
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=60))
def test_grow_tracked_counts_as_grow_does(policy, hot, ops):
    """The scheduler grows its decoding requests with one clock (grow_tracked) instead of a pass over
    them; it also asks can_admit with the reserve as a LazyReserve (a bound, the exact value on demand).
    Planted bugs this catches (each tried): the clock not moved (token counts differ), can_admit
    answering from the bound when it does not fit."""
    _life(policy, ops, hot, tracked=True)


def test_pages_of_one_slot_grow_page_by_page():
    """``paged1`` (pages of one slot) takes a slot per token like ``token`` but from a page pool, which
    has no one-call block allocation: extend_all must go page by page. It crashed (AttributeError:
    'PagedPool' object has no attribute 'allocate') on the first decode step of any paged1 run."""
    a = make_allocator("paged1", CAP)
    for r in range(3):
        a.admit(r, np.arange(10, dtype=np.int64) + 100 * r)
        a.extend(r, 10)
    free = a.store.free
    slots = a.extend_all([0, 1, 2], 2)
    assert [s.size for s in slots] == [2, 2, 2] and a.store.free == free - 6
    a.grow([0, 1, 2], 1)
    assert a.num_tokens(0) == 13 and a.store.free == free - 9
    _check_ownership(a)


def test_a_released_request_leaves_the_tracked_ones():
    """Finished and preempted requests stop being tracked, with the steps they took: what a finish
    caches and frees equals a grow() allocator's, and the others then grow alone. Planted bugs caught:
    release leaving the request tracked (grow_tracked refuses the list); untrack without catching the
    request up first (the finish caches and frees two tokens too few)."""
    a, b = make_allocator("token", CAP), make_allocator("token", CAP)  # grow, grow_tracked
    for x in (a, b):
        for r in range(3):
            x.admit(r, np.arange(10, dtype=np.int64) + 100 * r)
            x.extend(r, 10)
    for r in range(3):
        b.track(r)
    a.grow([0, 1, 2], 2)
    b.grow_tracked([0, 1, 2], 2)
    for x in (a, b):
        x.release(1, np.arange(12, dtype=np.int64) + 100)
        x.release(2)
    assert _counts(a) == _counts(b) and _nodes(a) == _nodes(b)
    b.grow_tracked([0], 3)
    assert b.num_tokens(0) == 15 and sorted(b.live_requests()) == [0]


def test_grow_tracked_needs_every_tracked_request():
    """grow_tracked stands for every tracked request: a list of another length is refused."""
    a = make_allocator("token", CAP)
    for r in range(3):
        a.admit(r, np.arange(10, dtype=np.int64) + 100 * r)
        a.extend(r, 10)
        a.track(r)
    with pytest.raises(ValueError, match="2 requests given, 3 tracked"):
        a.grow_tracked([0, 1], 1)
