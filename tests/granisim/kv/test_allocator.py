"""Allocator policies: HOT placement, prefix groups, HOT pressure, paged fragmentation, bad input."""

import numpy as np
import pytest

from granisim.kv import KVAllocator, KVCopy, OutOfKVMemory, make_allocator


def toks(base, n):
    return np.arange(base, base + n, dtype=np.int64)


class Shadow:
    """Token id stored in every slot: KV writes and compaction copies are replayed on it."""

    def __init__(self, alloc: KVAllocator):
        self.alloc = alloc
        self.mem = np.full(alloc.capacity, -1, np.int64)

    def extend(self, rid, tokens, start, n):
        slots = self.alloc.extend(rid, n)
        self.sync()
        self.mem[slots] = tokens[start : start + n]
        return slots

    def sync(self):
        for c in self.alloc.take_copies():
            self.mem[c.dst : c.dst + c.length] = self.mem[c.src : c.src + c.length].copy()

    def holds(self, rid, tokens):
        lay = self.alloc.layout(rid)
        return np.array_equal(self.mem[lay.slots()], tokens[: lay.num_tokens])


def run_prefill(alloc, rid, prompt, shared, shadow=None):
    """Admit, compute the whole prompt, cache the declared shared prefix."""
    cached = alloc.admit(rid, prompt, shared)
    if shadow is not None:
        shadow.sync()
        shadow.extend(rid, prompt, cached, prompt.size - cached)
    else:
        alloc.extend(rid, prompt.size - cached)
    if shared:
        alloc.cache_prefix(rid, prompt[:shared])
    return cached


def snapshot(alloc: KVAllocator):
    r = alloc.radix
    nodes = sorted((n.id, n.key.tolist(), n.value.tolist(), n.lock_ref, n.last_access) for n in r.nodes())
    hot = (alloc.hot.free_ranges(), alloc.hot.slabs()) if alloc.hot is not None else None
    return (alloc.stats(), hot, sorted(alloc.live_requests()), nodes, dict(r.evictable), dict(r.protected),
            [(k, i, p, s.tolist()) for k, i, p, s in alloc.ownership()])


# ---- construction ------------------------------------------------------------------------------
def test_make_allocator_policies():
    g = make_allocator("granikv", 1000, hot_fraction=0.25)
    assert g.policy == "granikv" and g.hot.capacity == 250 and g.store.capacity == 750 and g.page_size == 1
    assert set(g.stats().pools) == {"hot", "cold"}
    t = make_allocator("token", 1000)
    assert t.policy == "token" and t.hot is None and t.page_size == 1 and t.store.capacity == 1000
    p16 = make_allocator("paged16", 1000)
    assert p16.policy == "paged" and p16.page_size == 16 and p16.radix.page_size == 16
    assert p16.store.capacity == 992  # whole pages only
    assert make_allocator("paged", 1000).page_size == 16
    assert make_allocator("paged", 1000, page_size=4).page_size == 4
    assert make_allocator("paged8", 1000).page_size == 8
    assert make_allocator("granikv", 100, hot_fraction=np.float32(0.5)).hot.capacity == 50


# ---- granikv: HOT placement and prefix groups ---------------------------------------------------
def test_declared_shared_prefix_goes_to_a_hot_slab_and_is_shared():
    a = make_allocator("granikv", 200, hot_fraction=0.25)
    sh = Shadow(a)
    agent = toks(1000, 20)
    p1 = np.concatenate([agent, toks(1, 5)])
    assert run_prefill(a, 1, p1, 20, sh) == 0
    lay1 = a.layout(1)
    assert [s.pool for s in lay1.segments] == ["hot", "cold"]
    hot_seg = lay1.segments[0]
    assert hot_seg.slab is not None and hot_seg.slab[1] == 20
    assert np.array_equal(hot_seg.slots, np.arange(hot_seg.slab[0], hot_seg.slab[0] + 20))
    assert lay1.segments[1].slab is None and len(lay1.segments[1]) == 5
    g1 = a.prefix_group(1)
    assert g1[1:] == (20, "slab") and lay1.group == g1[0] and lay1.shared_len == 20
    assert sh.holds(1, p1)

    p2 = np.concatenate([agent, toks(50, 7)])
    assert run_prefill(a, 2, p2, 20, sh) == 20  # the second request hits the whole prefix
    lay2 = a.layout(2)
    assert a.prefix_group(2) == g1
    assert lay2.segments[0].slab == hot_seg.slab and np.array_equal(lay2.shared_slots(), hot_seg.slots)
    assert sh.holds(2, p2)
    st = a.stats()
    assert st.hot_placements == 1 and st.hot_fallbacks == 0
    assert st.lookups == 2 and st.hit_tokens == 20 and st.lookup_tokens == 25 + 27
    assert st.hit_rate == pytest.approx(20 / 52)
    assert st.pools["hot"].used == 20 and st.pools["hot"].cached == 0
    assert st.pools["cold"].used == 12

    a.release(1, p1)
    a.release(2, p2)
    st = a.stats()
    assert st.pools["hot"].cached == 20 and st.pools["hot"].used == 0
    assert st.pools["cold"].cached == 12  # both finished suffixes are cached too
    assert a.clear_cache() == 32 and a.stats().pools["cold"].free == 150 and a.stats().pools["hot"].free == 50


def test_undeclared_prefix_stays_cold():
    a = make_allocator("granikv", 200, hot_fraction=0.25)
    run_prefill(a, 1, toks(0, 20), 0)
    assert [s.pool for s in a.layout(1).segments] == ["cold"]
    assert a.stats().hot_placements == 0 and a.stats().pools["hot"].free == 50


def test_hot_full_evicts_the_lru_unlocked_slab():
    a = make_allocator("granikv", 100, hot_fraction=0.3)  # HOT 30
    pa, pb = toks(100, 16), toks(200, 16)
    for rid, p in ((1, pa), (2, pb)):
        run_prefill(a, rid, p, 15)
        a.release(rid, p)  # each leaves an unlocked 15-token slab + a 1-token cold node
    assert a.stats().pools["hot"].cached == 30 and a.hot.free == 0
    a.radix.match_prefix(pa)  # touch A: B is now least recently used
    pc = toks(300, 16)
    run_prefill(a, 3, pc, 15)
    st = a.stats()
    assert st.hot_evictions == 1 and st.hot_placements == 3 and st.hot_fallbacks == 0
    assert st.evictions == 2 and st.evicted_tokens == 16  # B's slab with its cold child
    assert a.radix.match_prefix(pa).length == 16  # A survived
    assert a.radix.match_prefix(pb).length == 0
    assert a.layout(3).segments[0].slab is not None


def test_hot_eviction_takes_a_leaf_slab_not_a_whole_subtree():
    """Regression: needing one slab, HOT eviction used to pick the LRU *ancestor* (ancestors are
    never more recent than their children) and drop its more recent HOT child with it."""
    a = make_allocator("granikv", 100, hot_fraction=0.3)  # HOT 30

    def cached(rid, p, shared):
        run_prefill(a, rid, p, shared)
        a.release(rid, p)

    x = toks(500, 11)
    cached(0, x, 10)
    p = toks(100, 11)
    cached(1, p, 10)  # agent prompt P: 10 HOT slots
    pq = np.concatenate([p[:10], toks(200, 11)])
    cached(2, pq, 20)  # a longer declared prefix P+Q: its 10 new slots are a HOT child of P
    a.radix.match_prefix(x)  # X is the most recent
    a.admit(3, toks(900, 11), 10)  # needs one 10-slot slab
    st = a.stats()
    assert st.hot_evictions == 1 and st.evicted_tokens == 11  # Q's slab and its 1-token cold child
    assert a.radix.match_prefix(pq).length == 10  # P is still cached
    assert a.radix.match_prefix(x).length == 11


def test_fragmented_hot_is_compacted_and_copies_are_queued():
    a = make_allocator("granikv", 100, hot_fraction=0.3)  # HOT 30
    sh = Shadow(a)
    prompts = {rid: toks(100 * (rid + 1), n + 2) for rid, n in enumerate([8, 7, 8, 7])}
    for rid, p in prompts.items():
        a.admit(rid, p, p.size - 2)
        sh.extend(rid, p, 0, p.size)
    a.release(1)
    a.release(3)  # preempted: their slabs go back, leaving two 7-slot holes
    st = a.stats()
    assert st.pools["hot"].free == 14 and st.pools["hot"].fragmentation == pytest.approx(0.5)
    assert a.take_copies() == []

    p = toks(5000, 14)
    a.admit(10, p, 12)  # needs 12 contiguous HOT slots: only possible after compaction
    copies = a.take_copies()
    assert copies == [KVCopy(src=15, dst=8, length=8)]  # request 2's slab slides down
    assert a.take_copies() == []  # handed over once
    sh.mem[8:16] = sh.mem[15:23].copy()  # the executor applies the copy
    st = a.stats()
    assert st.compactions == 1 and st.copied_tokens == 8
    assert st.hot_placements == 5 and st.hot_evictions == 0 and st.hot_fallbacks == 0
    assert st.pools["hot"].fragmentation == 0.0
    assert sh.holds(2, prompts[2]) and sh.holds(0, prompts[0])
    sh.extend(10, p, 0, 14)
    assert a.layout(10).segments[0].slab == (16, 12)


def test_hot_full_of_locked_slabs_falls_back_to_cold():
    a = make_allocator("granikv", 100, hot_fraction=0.2)  # HOT 20
    run_prefill(a, 1, toks(100, 22), 20)  # live: its slab stays locked
    p = toks(200, 12)
    run_prefill(a, 2, p, 10)
    st = a.stats()
    assert st.hot_placements == 1 and st.hot_fallbacks == 1 and st.hot_evictions == 0 and st.compactions == 0
    assert [s.pool for s in a.layout(2).segments] == ["cold"]
    assert a.prefix_group(2)[1:] == (10, "cold")
    # a declared prefix longer than the whole HOT pool can never get a slab
    run_prefill(a, 3, toks(300, 40), 30)
    assert a.stats().hot_fallbacks == 2


def test_hot_eviction_then_compaction_when_neither_alone_suffices():
    a = make_allocator("granikv", 100, hot_fraction=0.3)  # HOT 30
    pa, pb, pc = toks(100, 11), toks(200, 11), toks(300, 11)
    for rid, p in ((1, pa), (2, pb)):
        run_prefill(a, rid, p, 10)
    a.admit(3, pc, 10)  # reserves [20, 30) but is preempted before its prefix is cached
    a.extend(3, 5)
    a.release(1, pa)  # [0, 10) cached, unlocked
    a.release(3)  # [20, 30) freed outright
    # 10 free + 10 evictable; a 20-slot slab needs A evicted and B moved
    a.admit(4, toks(400, 21), 20)
    st = a.stats()
    assert st.hot_evictions == 1 and st.compactions == 1 and st.hot_placements == 4
    assert a.take_copies() == [KVCopy(src=10, dst=0, length=10)]


def test_shared_prefix_node_split_keeps_slabs_in_step():
    a = make_allocator("granikv", 200, hot_fraction=0.5)
    sh = Shadow(a)
    long = toks(0, 30)
    run_prefill(a, 1, np.concatenate([long, toks(900, 3)]), 30, sh)
    p2 = np.concatenate([long[:12], toks(500, 4)])  # matches 12 of the 30-token slab
    assert a.admit(2, p2, 0) == 12
    heads = [n for n in a.radix.nodes() if n.pool == "hot"]
    assert sorted(len(n) for n in heads) == [12, 18]
    for n in heads:
        assert a.hot.span(n.slab) == (int(n.value[0]), len(n))
    head = next(n for n in heads if len(n) == 12)
    sh.extend(2, p2, 12, 4)
    assert sh.holds(2, p2) and a.layout(2).segments[0].slab == (int(head.value[0]), 12)


def test_layout_slab_requires_hot_runs_in_address_order():
    """Regression: HOT runs [0], [2], [1], [3] on one path span slots 0..3 but are not one slab."""
    a = make_allocator("granikv", 40, hot_fraction=0.1)  # HOT 4

    def cached(rid, prompt, shared):
        p = np.array(prompt)
        run_prefill(a, rid, p, shared)
        a.release(rid, p)

    cached(0, [1, 9], 1)  # [1] -> slot 0
    a.admit(99, np.array([7, 9]), 1)  # holds slot 1
    cached(1, [1, 2, 9], 2)  # [2] -> slot 2
    a.release(99)
    cached(2, [1, 2, 3, 9], 3)  # [3] -> slot 1
    run_prefill(a, 3, np.array([1, 2, 3, 4, 9]), 4)  # [4] -> slot 3
    lay = a.layout(3)
    assert lay.segments[0].slots.tolist() == [0, 2, 1, 3]
    assert lay.segments[0].slab is None
    assert a.prefix_group(3)[1:] == (4, "hot")


# ---- paged and token policies -------------------------------------------------------------------
def test_paged16_internal_fragmentation():
    a = make_allocator("paged16", 256)
    a.admit(1, toks(0, 20))
    a.extend(1, 20)
    ps = a.stats().pools["paged"]
    assert (ps.used, ps.free, ps.cached) == (32, 224, 0)
    assert ps.fragmentation == pytest.approx(12 / 32)
    a.extend(1, 12)  # fills the second page: no new page
    assert a.stats().pools["paged"].used == 32 and a.stats().pools["paged"].fragmentation == 0.0
    a.extend(1, 1)
    ps = a.stats().pools["paged"]
    assert ps.used == 48 and ps.fragmentation == pytest.approx(15 / 48)
    assert a.layout(1).num_tokens == 33 and a.layout(1).slots().size == 33


def test_paged_matching_and_caching_is_floored_to_pages():
    a = make_allocator("paged", 256, page_size=16)
    p = toks(0, 40)
    a.admit(1, p)
    a.extend(1, 40)
    a.release(1, p)
    st = a.stats().pools["paged"]
    assert st.cached == 32 and st.used == 0 and st.free == 224  # the partial third page is freed
    assert a.admit(2, toks(0, 40)) == 32
    assert a.admit(3, toks(0, 31)) == 16


def test_token_policy_caches_every_token():
    a = make_allocator("token", 64)
    p = toks(0, 10)
    a.admit(1, p)
    a.extend(1, 10)
    a.release(1, p)
    assert a.stats().pools["token"].cached == 10
    assert a.admit(2, toks(0, 7)) == 6  # at least one prompt token is always computed
    assert a.layout(2).segments[0].pool == "token"


def test_extend_evicts_cached_tokens_then_raises_when_out_of_memory():
    a = make_allocator("token", 32)
    p = toks(0, 20)
    a.admit(1, p)
    a.extend(1, 20)
    a.release(1, p)
    a.admit(2, toks(100, 5))
    a.extend(2, 25)  # needs 25, only 12 free: evicts the cached 20
    st = a.stats()
    assert st.evictions == 1 and st.evicted_tokens == 20 and st.pools["token"].free == 7
    with pytest.raises(OutOfKVMemory, match="request 2"):
        a.extend(2, 8)


# ---- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [0, -1, -4096, 10.0, True, "1024"])
@pytest.mark.parametrize("policy", ["granikv", "token", "paged"])
def test_capacity_must_be_positive(policy, capacity):
    with pytest.raises(ValueError, match=f"got {capacity!r}".replace(".", r"\.")):
        make_allocator(policy, capacity)


@pytest.mark.parametrize("hot_fraction", [-0.01, 1.0001, 2, float("nan"), float("inf"), None])
def test_hot_fraction_must_be_within_unit_interval(hot_fraction):
    with pytest.raises(ValueError, match=f"got {hot_fraction!r}".replace(".", r"\.")):
        make_allocator("granikv", 100, hot_fraction=hot_fraction)


@pytest.mark.parametrize("hot_fraction", [0, 0.0, 1, 1.0])
def test_hot_fraction_bounds_are_accepted(hot_fraction):
    a = make_allocator("granikv", 100, hot_fraction=hot_fraction)
    assert a.hot.capacity + a.store.capacity == 100


@pytest.mark.parametrize("page_size", [0, -16, 1.5])
def test_page_size_must_be_at_least_one(page_size):
    with pytest.raises(ValueError, match=f"got {page_size!r}".replace(".", r"\.")):
        make_allocator("paged", 100, page_size=page_size)
    with pytest.raises(ValueError, match=f"got {page_size!r}".replace(".", r"\.")):
        KVAllocator("paged", 100, page_size=page_size)


def test_paged0_and_unknown_policies_are_rejected():
    with pytest.raises(ValueError, match="got 0"):
        make_allocator("paged0", 100)
    for bad in ("pagedx", "lru", ""):
        with pytest.raises(ValueError, match=repr(bad)):
            make_allocator(bad, 100)


@pytest.fixture(params=["granikv", "token", "paged"])
def busy(request):
    """An allocator with live requests, cached prefixes and a HOT slab."""
    page = 4 if request.param == "paged" else None
    a = make_allocator(request.param, 256, hot_fraction=0.25, page_size=page)
    agent = toks(1000, 16)
    for rid in range(3):
        p = np.concatenate([agent, toks(100 * rid, 6)])
        run_prefill(a, rid, p, 16)
    a.release(0, np.concatenate([agent, toks(0, 6)]))
    a.release(1)
    return a


def test_release_of_an_unknown_or_released_request_raises_and_changes_nothing(busy):
    before = snapshot(busy)
    for rid in (0, 1, 12345, -1):
        with pytest.raises(ValueError, match=rf"request id {rid}\b"):
            busy.release(rid)
        with pytest.raises(ValueError, match=rf"request id {rid}\b"):
            busy.release(rid, toks(0, 4))
        assert snapshot(busy) == before
    with pytest.raises(ValueError, match="12345"):
        busy.extend(12345, 1)
    assert snapshot(busy) == before
    busy.release(2)
    assert busy.live_requests() == []


def test_admitting_a_live_request_id_again_changes_nothing(busy):
    before = snapshot(busy)
    with pytest.raises(ValueError, match="2"):
        busy.admit(2, toks(0, 8))
    assert snapshot(busy) == before


def test_unlock_below_zero_through_the_allocator_changes_nothing(busy):
    unlocked = next(n for n in busy.radix.nodes() if n.lock_ref == 0)
    before = snapshot(busy)
    with pytest.raises(ValueError, match=f"node {unlocked.id}"):
        busy.radix.unlock(unlocked)
    assert snapshot(busy) == before


def test_double_free_in_the_pools_changes_nothing(busy):
    before = snapshot(busy)
    if busy.hot is not None:
        dead = max(busy.hot.slabs(), default=-1) + 1
        with pytest.raises(ValueError, match=str(dead)):
            busy.hot.release(dead)
    free_slot = None
    if busy.policy != "paged":
        mask = busy.store.pool.free_mask()
        free_slot = int(np.flatnonzero(mask)[0]) + busy.store.pool.slot_start
        with pytest.raises(ValueError, match=str(free_slot)):
            busy.store.release(np.array([free_slot]))
    else:
        with pytest.raises(ValueError, match="already free"):
            busy.store.release(busy.store.pool.page_slots(np.array([busy.store.pool.num_pages - 1])))
    assert snapshot(busy) == before
