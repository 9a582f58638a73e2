"""Replica views: which role prefixes a cache holds, read without changing the radix index."""

import numpy as np

from granisim.fleet.views import RoleCache, cached_prefix
from granisim.kv.allocator import make_allocator


def serve(alloc, rid, tokens, shared):
    """Admit, compute and finish one request (its prefix becomes cached)."""
    alloc.admit(rid, tokens, shared)
    alloc.extend(rid, tokens.size - alloc.num_tokens(rid))
    alloc.cache_prefix(rid, tokens[:shared])
    alloc.release(rid, tokens)


def prefixes(k=3, n=256):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 32000, n, dtype=np.int64) for _ in range(k)]


def test_roles_cached_and_in_hot_slabs():
    ps = prefixes()
    for policy, hot in (("granikv", True), ("token", False)):
        alloc = make_allocator(policy, 20_000, hot_fraction=0.5)
        roles = RoleCache(ps)
        assert roles.roles(alloc.radix) == (frozenset(), frozenset())
        serve(alloc, 1, np.concatenate([ps[1], np.arange(40)]), 256)
        cached, in_hot = roles.roles(alloc.radix)
        assert cached == {1}
        assert in_hot == ({1} if hot else set())


def test_a_partly_cached_prefix_does_not_count():
    ps = prefixes()
    alloc = make_allocator("token", 20_000)
    half = np.concatenate([ps[2][:128], np.arange(200)])  # shares only the first half of role 2's prefix
    serve(alloc, 1, half, 128)
    assert cached_prefix(alloc.radix, ps[2])[0] == 128
    assert RoleCache(ps).roles(alloc.radix)[0] == frozenset()


def test_reading_does_not_split_nodes_or_touch_lru_clocks():
    ps = prefixes()
    alloc = make_allocator("token", 20_000)
    serve(alloc, 1, np.concatenate([ps[0], np.arange(50)]), 256)
    before = (alloc.radix.num_nodes, alloc.radix._clock, alloc.radix._next_id)
    partial = np.concatenate([ps[0][:100], np.arange(7)])  # match_prefix would split the node here
    assert cached_prefix(alloc.radix, partial)[0] == 100
    RoleCache(ps).roles(alloc.radix)
    assert (alloc.radix.num_nodes, alloc.radix._clock, alloc.radix._next_id) == before
