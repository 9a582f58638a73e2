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


def _life(policy, ops, hot_fraction=0.25):
    """Replay ``ops`` on a grow() allocator and an extend_all() one; compare after each op."""
    a = make_allocator(policy, CAP, hot_fraction=hot_fraction)  # grow
    b = make_allocator(policy, CAP, hot_fraction=hot_fraction)  # extend_all
    reqs = {}  # rid -> [tokens, shared, done, limit]
    rid = 0
    for op in ops:
        if op[0] == "admit":
            tokens, shared = _prompt(op[1], rid, op[2])
            total = np.concatenate([tokens, np.arange(60, dtype=np.int64) + 900_000 + rid * 100])
            fits = a.can_admit(tokens, shared, 0)
            assert fits == b.can_admit(tokens, shared, 0)
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
        elif op[0] == "decode":
            n = op[1]
            rids = sorted(r for r, q in reqs.items() if q[2] >= q[3] and q[2] + n <= q[0].size)
            if not rids:
                continue
            fits = a.can_grow(rids, n)
            assert fits == b.can_extend_all(rids, n)
            if not fits:
                continue
            a.grow(rids, n)
            b.extend_all(rids, n)
            for r in rids:
                reqs[r][2] += n
        elif reqs:
            r = sorted(reqs)[op[1] % len(reqs)]
            q = reqs.pop(r)
            if op[0] == "finish":
                a.release(r, q[0][: q[2]])
                b.release(r, q[0][: q[2]])
            else:
                a.release(r)
                b.release(r)
        assert _counts(a) == _counts(b), op
        assert _nodes(a) == _nodes(b), op
    _check_ownership(a)
    _check_ownership(b)
    assert _counts(a) == _counts(b)


@pytest.mark.parametrize("policy,hot", [("granikv", 0.25), ("token", 0.2), ("paged16", 0.2), ("granikv", "adaptive")])
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


def _life_tracked(policy, ops, hot_fraction=0.25):
    """Replay ``ops`` on a grow() allocator and a grow_tracked() one (each request tracked from its
    first decode step to its release); every decode step grows every decoding request, as the
    scheduler's do. Compare after each op."""
    a = make_allocator(policy, CAP, hot_fraction=hot_fraction)  # grow
    c = make_allocator(policy, CAP, hot_fraction=hot_fraction)  # grow_tracked
    reqs = {}  # rid -> [tokens, shared, done, limit]
    rid = 0
    for op in ops:
        if op[0] == "admit":
            tokens, shared = _prompt(op[1], rid, op[2])
            total = np.concatenate([tokens, np.arange(60, dtype=np.int64) + 900_000 + rid * 100])
            reserve, slack = (rid * 37) % 300, rid % 50  # c gets the reserve as a bound and, if asked, exactly
            fits = a.can_admit(tokens, shared, reserve)  # (it notes demand: adaptive HOT)
            assert fits == c.can_admit(tokens, shared, LazyReserve(reserve + slack, lambda: reserve))
            if fits:
                a.admit(rid, tokens, shared)
                reqs[rid] = [total, shared, c.admit(rid, tokens, shared), tokens.size]
            rid += 1
        elif op[0] == "prefill":
            todo = sorted(r for r, q in reqs.items() if q[2] < q[3])
            if not todo:
                continue
            r = todo[op[1] % len(todo)]
            q = reqs[r]
            n = min(op[2], q[3] - q[2])
            fits = a.can_extend({r: n})
            assert fits == c.can_extend({r: n})
            if not fits:
                continue
            a.extend(r, n)
            c.extend(r, n)
            q[2] += n
            if q[1] and q[2] >= q[1]:
                a.cache_prefix(r, q[0][: q[1]])
                c.cache_prefix(r, q[0][: q[1]])
            if q[2] == q[3]:  # its prompt is computed: it decodes from now on
                c.track(r)
        elif op[0] == "decode":
            n = op[1]
            rids = sorted(r for r, q in reqs.items() if q[2] >= q[3])
            if not rids or any(reqs[r][2] + n > reqs[r][0].size for r in rids):
                continue
            fits = a.can_grow(rids, n)
            assert fits == c.can_grow(rids, n)
            if not fits:
                continue
            a.grow(rids, n)
            c.grow_tracked(rids, n)
            for r in rids:
                reqs[r][2] += n
        elif reqs:
            r = sorted(reqs)[op[1] % len(reqs)]
            q = reqs.pop(r)
            for x in (a, c):
                x.release(r, q[0][: q[2]]) if op[0] == "finish" else x.release(r)
        if op[0] != "decode":  # (reading counts catches a tracked request up: let some steps lag)
            assert _counts(a) == _counts(c), op
            assert _nodes(a) == _nodes(c), op
    _check_ownership(c)
    assert _counts(a) == _counts(c)


@pytest.mark.parametrize("policy,hot", [("granikv", 0.25), ("token", 0.2), ("paged16", 0.2), ("granikv", "adaptive")])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=60))
def test_grow_tracked_counts_as_grow_does(policy, hot, ops):
    """The scheduler grows its decoding requests with one clock (grow_tracked) instead of a pass over
    them; it also asks can_admit with the reserve as a LazyReserve (a bound, the exact value on demand).
    Planted bugs this catches (each tried): the clock not moved (token counts differ), untrack
    without catching the request up first (a finish caches fewer tokens), can_admit answering from the
    bound when it does not fit."""
    _life_tracked(policy, ops, hot)


def test_a_released_request_leaves_the_tracked_ones():
    """Finished and preempted requests stop being tracked: the others then grow alone, each by what it
    took. Planted bug caught: release leaving the request tracked (grow_tracked refuses the list)."""
    a = make_allocator("token", CAP)
    for r in range(3):
        a.admit(r, np.arange(10, dtype=np.int64) + 100 * r)
        a.extend(r, 10)
        a.track(r)
    a.grow_tracked([0, 1, 2], 2)
    a.release(1, np.arange(12, dtype=np.int64) + 100)
    a.release(2)
    a.grow_tracked([0], 3)
    assert a.num_tokens(0) == 15 and sorted(a.live_requests()) == [0]


def test_grow_tracked_needs_every_tracked_request():
    """grow_tracked stands for every tracked request: a list of another length is refused."""
    a = make_allocator("token", CAP)
    for r in range(3):
        a.admit(r, np.arange(10, dtype=np.int64) + 100 * r)
        a.extend(r, 10)
        a.track(r)
    with pytest.raises(ValueError, match="2 requests given, 3 tracked"):
        a.grow_tracked([0, 1], 1)
