"""Router decisions on hand-built views: each test pins a choice that another policy would make differently."""

from granisim.config.scenario import FleetCfg
from granisim.fleet.routers import (POLICIES, CacheAware, HotAware, Router, cache_aware, hot_aware, initial_state,
                                    least_load, make_ring, place_roles, role_affinity, round_robin)
from granisim.fleet.views import ReplicaView, RequestView


def req(role=0, prompt=17000, shared=16384, rid=0):
    return RequestView(rid, 0.0, prompt, 100, shared, role)


def view(i, *, waiting=0, running=0, outstanding=0, free=100_000, cached=(), hot=(), up=True, hot_cap=163_840):
    return ReplicaView(i, up, waiting, running, outstanding, 0, free, 800_000, hot_cap, frozenset(cached),
                       frozenset(hot))


def test_round_robin_cycles_and_skips_down_replicas():
    views = [view(0), view(1, up=False), view(2)]
    state, got = 0, []
    for _ in range(4):
        i, state = round_robin(req(), views, state)
        got.append(i)
    assert got == [0, 2, 0, 2]


def test_least_load_takes_fewest_outstanding_tokens():
    views = [view(0, outstanding=500, running=1), view(1, outstanding=200, running=3), view(2, outstanding=900)]
    assert least_load(req(), views)[0] == 1


def test_cache_aware_follows_the_cache_where_least_load_does_not():
    views = [view(0, outstanding=40_000, running=3, cached={7}), view(1, outstanding=1_000, running=1)]
    assert cache_aware(req(role=7), views, CacheAware())[0] == 0
    assert least_load(req(role=7), views)[0] == 1


def test_cache_aware_balances_when_load_is_uneven():
    # 40 requests more than the other replica (> balance_abs = 32) and more than 1.0001x: least loaded wins
    views = [view(0, running=41, cached={7}), view(1, running=1)]
    assert cache_aware(req(role=7), views, CacheAware())[0] == 1
    assert cache_aware(req(role=7), views, CacheAware(balance_abs=64))[0] == 0


def test_cache_aware_without_a_good_match_takes_the_most_free_kv():
    views = [view(0, free=10_000), view(1, free=90_000), view(2, free=50_000, cached={3})]
    assert cache_aware(req(role=7), views, CacheAware())[0] == 1
    # a match covering less than cache_threshold of the prompt does not count either
    assert cache_aware(req(role=3, prompt=40_000), views, CacheAware(cache_threshold=0.5))[0] == 1
    assert cache_aware(req(role=3, prompt=40_000), views, CacheAware(cache_threshold=0.3))[0] == 2


def test_role_affinity_keeps_a_role_on_one_replica_until_it_is_overloaded():
    ring = make_ring(4, seed=1, load_factor=1.25)
    views = [view(i) for i in range(4)]
    homes = {role: role_affinity(req(role=role), views, ring)[0] for role in range(16)}
    assert len(set(homes.values())) > 1  # roles spread over replicas
    again = {role: role_affinity(req(role=role, rid=99), views, ring)[0] for role in range(16)}
    assert again == homes  # same role, same replica (round robin would move it)
    home = homes[5]
    loaded = [view(i, running=20 if i == home else 2) for i in range(4)]
    assert role_affinity(req(role=5), loaded, ring)[0] != home  # bounded load: 21 > 1.25 x mean


def test_role_affinity_ring_depends_on_the_seed_only():
    assert make_ring(4, seed=1) == make_ring(4, seed=1)
    assert make_ring(4, seed=1).points != make_ring(4, seed=2).points


def test_place_roles_spreads_roles_and_replicates_popular_ones():
    uniform = place_roles([1.0] * 16, [10] * 4)
    per = [sum(i in reps for reps in uniform) for i in range(4)]
    assert per == [4, 4, 4, 4] and all(len(r) == 1 for r in uniform)
    skew = place_roles([40.0] + [1.0] * 15, [10] * 4)
    assert len(skew[0]) == 3  # 40/55 of the demand: ceil(0.73 x 4) replicas
    # a HOT pool holding two slabs takes no more than two roles while others have room
    tight = place_roles([1.0] * 8, [2] * 4)
    assert [sum(i in reps for reps in tight) for i in range(4)] == [2, 2, 2, 2]


def test_place_roles_keeps_roles_where_they_were():
    prev = tuple((i % 4,) for i in range(15, -1, -1))  # a valid but different balanced placement
    assert place_roles([1.0] * 16, [10] * 4, prev) == prev
    assert place_roles([1.0] * 16, [10] * 4) != prev


def test_hot_aware_routes_to_the_roles_placement_not_the_cache():
    views = [view(0, cached={5}), view(1), view(2), view(3)]
    st = HotAware(roles=16)
    i, st = hot_aware(req(role=5), views, st)
    assert i == st.placement[5][0] == 1  # role 5 is placed on replica 1 (16 roles round the 4 replicas)
    assert cache_aware(req(role=5), views, CacheAware())[0] == 0


def test_hot_aware_rebalances_when_popularity_shifts():
    views = [view(i) for i in range(4)]
    st = HotAware(rebalance_every=64, roles=16)
    for k in range(64):
        _, st = hot_aware(req(role=0, rid=k), views, st)
    assert st.reviews == 1 and len(st.placement[0]) == 4  # role 0 took every arrival: on every replica
    for k in range(64 * 4):
        _, st = hot_aware(req(role=1 + k % 15, rid=k), views, st)
    assert len(st.placement[0]) < 4  # its share fell: fewer copies


def test_hot_aware_falls_back_to_least_load_when_imbalanced_or_no_role():
    st = HotAware(roles=16)
    views = [view(0, running=50, outstanding=9_000), view(1, running=1, outstanding=100),
             view(2, running=2, outstanding=50), view(3, running=1, outstanding=300)]
    assert hot_aware(req(role=0), views, st)[0] == 2  # role 0 is placed on 0, but 0 is swamped
    assert hot_aware(req(role=-1, shared=0), [view(0, outstanding=5), view(1)], st)[0] == 1


def test_router_holds_state_and_every_policy_has_a_start():
    cfg = FleetCfg()
    for name in POLICIES:
        r = Router(name, initial_state(name, cfg, 3, seed=0, roles=4))
        picks = [r.route(req(role=k % 4, rid=k), [view(i) for i in range(3)]) for k in range(6)]
        assert all(0 <= p < 3 for p in picks) and r.decisions == 6
    rr = Router("round_robin", 0)
    assert [rr.route(req(), [view(i) for i in range(3)]) for _ in range(4)] == [0, 1, 2, 0]
