"""The simulated fleet on a recorded routing (granisim.fleet.routers.replay, granisim.validation.fleet_routing)."""

import json

import pandas as pd

from granisim.config.scenario import parse_scenario
from granisim.fleet.build import simulate_fleet
from granisim.fleet.outputs import fleet_requests
from granisim.fleet.routers import Router, replay, replayed
from granisim.fleet.views import ReplicaView, RequestView
from granisim.validation.fleet_routing import on_measured_routing, same_replica

BASE = {"name": "tiny-fleet", "seed": 5,
        "workload": {"kind": "multi_agent", "roles": 4, "prefix_len": 512, "num_requests": 30, "rate": 30.0,
                     "max_output_len": 16},
        "scheduler": {"max_batch_tokens": 4096}}


def _scenario(router: str):
    return parse_scenario({**json.loads(json.dumps(BASE)), "fleet": {"replicas": 3, "router": router}})


def test_replay_follows_the_record_and_falls_back_to_least_load():
    """A recorded request goes where the record says; one the record lacks, or whose replica is down, goes to the
    least-loaded replica that is up. Planted: ignoring the record (least load always) fails the first check."""
    state = replayed([(7, 2), (3, 0)])
    views = [ReplicaView(0, outstanding_tokens=50), ReplicaView(1, outstanding_tokens=10),
             ReplicaView(2, outstanding_tokens=90)]
    req = lambda rid: RequestView(rid, 0.0, 10, 5, 0)  # noqa: E731
    assert replay(req(7), views, state)[0] == 2 and replay(req(3), views, state)[0] == 0
    assert replay(req(5), views, state)[0] == 1  # not in the record
    down = [views[0], views[1], ReplicaView(2, up=False)]
    assert replay(req(7), down, state)[0] == 1
    assert replay(req(7), views, state)[1] is state


def test_the_fleet_on_its_own_recorded_routing_reproduces_itself():
    """Replaying a simulated fleet's own routing reproduces its figures exactly (every error 0, every request on the
    same replica), and a routing moved elsewhere is followed: each replica serves what the record gives it."""
    sc = _scenario("cache_aware")
    own = fleet_requests(simulate_fleet(sc, progress=False))
    rep = on_measured_routing(sc, "<test>", own)
    assert rep["same_replica"] == 1.0
    for sec in [rep["fleet"], *rep["replicas"]]:
        assert all(e["error"] == 0 for e in sec["end_to_end"].values()), sec
    moved = own.assign(replica=(own.replica + 1) % 3)
    routed = fleet_requests(simulate_fleet(sc, progress=False,
                                           router=Router("replay", replayed(zip(moved.rid, moved.replica)), replay)))
    assert same_replica(moved, routed) == 1.0 and same_replica(own, routed) == 0.0
    assert sorted(r["replica"] for r in on_measured_routing(sc, "<test>", moved)["replicas"]) == [0, 1, 2]


def test_same_replica_matches_requests_by_id():
    m = pd.DataFrame({"rid": [0, 1, 2, 3], "replica": [0, 1, 0, 1]})
    p = pd.DataFrame({"rid": [3, 2, 1, 0], "replica": [1, 1, 1, 0]})
    assert same_replica(m, p) == 0.75
