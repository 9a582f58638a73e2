"""The fleet loop: a fleet of one is the single loop, routing, staleness, faults, outputs, schema errors."""

import json
import math
import warnings

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from granisim.cli import main
from granisim.config.scenario import parse_scenario
from granisim.core.metrics import requests_frame, summarize
from granisim.costmodel.executor import CostExecutor
from granisim.experiments.run import prepare, simulate
from granisim.fleet.build import fleet_cfg, replica_specs, simulate_fleet
from granisim.fleet.loop import FleetLoop
from granisim.fleet.outputs import fleet_requests, fleet_steps, fleet_summary, write_fleet_outputs
from tests.granisim.fleet.planted import DropsOneReroute

BASE = {"name": "tiny-fleet", "seed": 5,
        "workload": {"kind": "multi_agent", "roles": 4, "prefix_len": 512, "num_requests": 36, "rate": 30.0,
                     "max_output_len": 24},
        "scheduler": {"max_batch_tokens": 4096}}


def scenario(fleet=None, **wl):
    data = json.loads(json.dumps(BASE))
    data["workload"].update(wl)
    if fleet is not None:
        data["fleet"] = fleet
    return parse_scenario(data)


def run(sc, loop_cls=FleetLoop):
    specs = replica_specs(sc)
    return loop_cls(specs, fleet_cfg(sc), lambda s: CostExecutor(s.profile, s.model), progress=False).run()


def test_a_fleet_of_one_is_the_single_loop():
    """Same summary as the single loop: routing through views built at every arrival changes nothing."""
    sc = scenario()
    single = simulate(prepare(sc), progress=False)
    want = summarize(requests_frame(single.records), single.steps.frame(), single.end_s)
    fleet = simulate_fleet(sc, progress=False)
    reqs = fleet_requests(fleet)
    got = summarize(reqs, fleet_steps(fleet), fleet.end_s)
    assert got == want
    assert (reqs.replica == 0).all()


def test_every_request_lands_once_with_its_replica():
    res = run(scenario({"replicas": 3, "router": "round_robin"}, turns=2))
    reqs = fleet_requests(res)
    assert reqs.rid.is_unique and (reqs.status == "completed").all()
    assert len(reqs) == 72  # 36 sessions x 2 turns: follow-ups are routed too
    first = reqs[reqs.turn == 0].sort_values("arrival_s")
    assert list(first.replica[:6]) == [0, 1, 2, 0, 1, 2]
    s = fleet_summary(res, reqs, fleet_steps(res))
    assert [r["replica"] for r in s["replicas"]] == [0, 1, 2]
    assert sum(r["completed"] for r in s["replicas"]) == s["completed"] == 72


def test_stale_views_send_everything_where_the_old_view_pointed():
    live = fleet_requests(run(scenario({"replicas": 3, "router": "least_load"})))
    stale = fleet_requests(run(scenario({"replicas": 3, "router": "least_load", "staleness_s": 1e6})))
    assert live.replica.nunique() == 3
    assert set(stale.replica) == {0}  # the only view ever taken is the empty fleet at t = 0


def test_a_replica_down_for_good_hands_its_requests_back():
    res = run(scenario({"replicas": 3, "router": "round_robin", "faults": [{"replica": 1, "at_s": 0.4}]}))
    reqs = fleet_requests(res)
    assert (reqs.status == "completed").all() and len(reqs) == 36
    assert not (reqs[reqs.arrival_s > 0.4].replica == 1).any()
    moved = reqs[reqs.rerouted > 0]
    assert len(moved) > 0 and set(moved.replica) <= {0, 2}
    s = fleet_summary(res, reqs, fleet_steps(res))
    assert s["rerouted"] == len(moved) and 0 < s["recomputed"] <= s["rerouted"]
    assert s["replicas"][1]["down_s"] > 0


@pytest.mark.parametrize("router", ["round_robin", "least_load", "cache_aware"])
def test_a_fault_strikes_before_anything_is_routed_in_its_instant(router):
    """catches: arrivals at a fault's instant were routed before it struck (to the failing replica), and with two
    replicas failing at once the first one's requests went to the second and came back again: a replica down at
    t = 0 handed back a request it never had, and the re-route counts were inflated."""
    both = run(scenario({"replicas": 2, "router": router, "faults": [{"replica": 0, "at_s": 0.0},
                                                                      {"replica": 1, "at_s": 0.0}]}))
    reqs = fleet_requests(both)
    assert (reqs.rerouted == 0).all() and (reqs.replica == -1).all() and not both.rerouted
    t = 0.3
    res = run(scenario({"replicas": 3, "router": router, "faults": [{"replica": 0, "at_s": t, "for_s": 0.2},
                                                                     {"replica": 1, "at_s": t, "for_s": 0.2}]}))
    reqs = fleet_requests(res)
    assert (reqs.status == "completed").all()
    assert (reqs.rerouted <= 1).all()  # each handed back once, to replica 2, never to the other failing one
    assert set(reqs[reqs.rerouted > 0].replica) == {2}


def test_a_replica_that_comes_back_starts_a_new_incarnation():
    res = run(scenario({"replicas": 2, "router": "round_robin", "faults": [{"replica": 0, "at_s": 0.3,
                                                                            "for_s": 0.2}]}))
    reqs, steps = fleet_requests(res), fleet_steps(res)
    assert (reqs.status == "completed").all()
    assert set(steps[steps.replica == 0].incarnation) == {0, 1}
    assert (reqs[reqs.arrival_s > 0.6].replica == 0).any()  # routed to again once it is back


def test_with_every_replica_down_for_good_requests_are_rejected_with_a_reason():
    res = run(scenario({"replicas": 2, "faults": [{"replica": 0, "at_s": 0.2}, {"replica": 1, "at_s": 0.3}]}))
    reqs = fleet_requests(res)
    late = reqs[reqs.replica == -1]
    assert len(late) > 0 and (late.status == "rejected").all()
    assert late.reason.str.contains("no replica up").all()
    assert len(reqs) == 36



def test_a_fault_due_after_the_last_request_changes_nothing():
    """A fault after the work is done used to move the run's end to the fault (a 20-second run reported over
    1,001 s, its throughput 50 times too low) and count the replica down for the second after."""
    sc = scenario({"replicas": 2})
    late = scenario({"replicas": 2, "faults": [{"replica": 1, "at_s": 1000.0, "for_s": 1.0},
                                               {"replica": 0, "at_s": 2000.0}]})
    want, got = run(sc), run(late)
    assert got.end_s == want.end_s < 100
    s_want, s_got = (fleet_summary(r, fleet_requests(r), fleet_steps(r)) for r in (want, got))
    assert s_got == s_want
    assert [rep.down_s for rep in got.replicas] == [0.0, 0.0]


def test_requests_held_with_every_replica_down_wait_for_one_coming_back_only():
    """Held requests end the run (rejected) once no fault that has begun will bring a replica back; a replica that
    is down for a while still gets them."""
    gone = run(scenario({"replicas": 1, "faults": [{"replica": 0, "at_s": 0.2}, {"replica": 0, "at_s": 500.0}]}))
    reqs = fleet_requests(gone)
    assert (reqs.replica == -1).any() and gone.end_s < 100
    back = run(scenario({"replicas": 1, "faults": [{"replica": 0, "at_s": 0.2, "for_s": 300.0}]}))
    reqs = fleet_requests(back)
    assert (reqs.status == "completed").all() and len(reqs) == 36 and back.end_s > 300

def check_nothing_lost(res, sessions: int, turns: int) -> None:
    """Every request finishes or is rejected with a reason, exactly once: every turn of every session is recorded
    (a turn after a rejected one as not sent); every finished turn's follow-up exists."""
    reqs = fleet_requests(res)
    assert reqs.rid.is_unique, "a request was recorded twice"
    assert set(range(sessions)) <= set(reqs.rid), "a first turn was lost"
    assert set(reqs.rid) == set(range(sessions * turns)), "a turn was lost"
    assert set(reqs.status) <= {"completed", "rejected"}
    assert (reqs[reqs.status == "rejected"].reason.str.len() > 0).all(), "a rejection without a reason"
    done = reqs[(reqs.status == "completed") & (reqs.turn + 1 < turns)]
    nxt = set(zip(reqs.session, reqs.turn))
    assert all((s, t + 1) in nxt for s, t in zip(done.session, done.turn)), "a follow-up turn was lost"


faults = st.lists(st.tuples(st.integers(0, 2), st.floats(0.0, 2.0), st.one_of(st.none(), st.floats(0.01, 1.0))),
                  max_size=4)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faults=faults, router=st.sampled_from(["round_robin", "least_load", "cache_aware", "role_affinity",
                                              "hot_aware"]))
def test_under_any_fault_schedule_nothing_is_lost(faults, router):
    """Planted bug check: with tests/granisim/fleet/planted.py's DropsOneReroute in place of FleetLoop here,
    hypothesis finds a schedule that loses a request within a few examples (tried; see also the test below)."""
    fl = [{"replica": r, "at_s": a, **({"for_s": d} if d is not None else {})} for r, a, d in faults]
    sc = scenario({"replicas": 3, "router": router, "faults": fl}, num_requests=20, turns=2)
    check_nothing_lost(run(sc), 20, 2)


def test_the_property_catches_a_reroute_that_drops_a_request():
    sc = scenario({"replicas": 3, "faults": [{"replica": 1, "at_s": 0.3}]}, num_requests=20, turns=2)
    check_nothing_lost(run(sc), 20, 2)
    with pytest.raises(AssertionError, match="lost"):
        check_nothing_lost(run(sc, DropsOneReroute), 20, 2)


def test_heterogeneous_groups_get_their_own_policy_and_profile():
    sc = scenario({"groups": [{"replicas": 2}, {"replicas": 1, "policy": "token", "profile": "h200"}],
                   "router": "least_load"})
    specs = replica_specs(sc)
    assert [s.setup.scenario.policy.name for s in specs] == ["granikv", "granikv", "token"]
    assert [s.setup.profile.name for s in specs][2] == "h200" and [s.group for s in specs] == [0, 0, 1]
    res = run(sc)
    s = fleet_summary(res, fleet_requests(res), fleet_steps(res))
    assert [r["policy"] for r in s["replicas"]] == ["granikv", "granikv", "token"]


def test_outputs_have_a_replica_column_and_a_replicas_list(tmp_path):
    res = run(scenario({"replicas": 2, "router": "cache_aware"}))
    s = write_fleet_outputs(res, tmp_path, dict(scenario="tiny"), plots=True)
    reqs, steps = pd.read_parquet(tmp_path / "requests.parquet"), pd.read_parquet(tmp_path / "steps.parquet")
    assert "replica" in reqs and "replica" in steps and set(steps.replica) == {0, 1}
    disk = json.loads((tmp_path / "summary.json").read_text())
    assert len(disk["replicas"]) == 2 and disk["router"] == "cache_aware" == s["router"]
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["args"]["name"] for e in trace if e["name"] == "process_name"} == {"replica 0", "replica 1"}
    assert (tmp_path / "replicas.png").exists()
    assert math.isclose(disk["throughput_rps"], s["throughput_rps"])


def write(tmp_path, text):
    p = tmp_path / "f.toml"
    p.write_text(text)
    return str(p)


TOML = """name = "tiny"
[workload]
roles = 2
prefix_len = 256
num_requests = 12
rate = 20.0
max_output_len = 8
"""


def test_cli_run_prints_the_fleet_table(tmp_path, capsys):
    path = write(tmp_path, TOML + "[fleet]\nreplicas = 2\nrouter = \"hot_aware\"\n")
    assert main(["run", path, "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "fleet (2)" in out and "router hot_aware" in out


def test_cli_compare_across_routers(tmp_path, capsys):
    path = write(tmp_path, TOML + "[fleet]\nreplicas = 2\n")
    assert main(["compare", path, "--routers", "round_robin,hot_aware", "--out", str(tmp_path / "c")]) == 0
    got = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert set(got) == {"round_robin", "hot_aware"} and got["hot_aware"]["router"] == "hot_aware"
    assert main(["compare", path, "--routers", "nope"]) == 2
    assert "unknown router 'nope'" in capsys.readouterr().err


def test_cli_compare_routers_refuses_policies_it_would_not_run(tmp_path, capsys):
    """catches: `compare --routers R --policies token` ran the scenario's own policy (granikv) behind each router and
    said nothing of token."""
    path = write(tmp_path, TOML + "[fleet]\nreplicas = 2\n")
    assert main(["compare", path, "--routers", "round_robin", "--policies", "token",
                 "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --policies token") and "--routers" in err[0], err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("fleet", ["", "[fleet]\nreplicas = 1\n"])
def test_compare_routers_refuses_a_single_replica(tmp_path, capsys, fleet):
    """catches: `compare --routers` of a scenario without [fleet] ran one identical row per router (exit 0)."""
    path = write(tmp_path, TOML + fleet)
    assert main(["compare", path, "--routers", "round_robin,cache_aware", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--routers round_robin,cache_aware" in err[0] and "one replica" in err[0], err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("fleet, field", [
    ("replicas = 0", "fleet.replicas = 0"),
    ("router = \"random\"", "fleet.router = 'random'"),
    ("staleness_s = -1", "fleet.staleness_s = -1"),
    ("replicas = 2\n[[fleet.faults]]\nreplica = 5\nat_s = 1", "fleet.faults.0.replica = 5"),
    ("[[fleet.groups]]\nreplicas = 1\npolicy = \"lru\"", "fleet.groups.0.policy = 'lru'"),
    ("[[fleet.groups]]\nreplicas = 1\nprofile = \"nope\"", "fleet.groups.0.profile = 'nope'"),
    ("replicas = 3\n[[fleet.groups]]\nreplicas = 2", "fleet.replicas = 3"),
    # catches: an OverflowError traceback (exit 1) from role_affinity's cap, and a fault whose length put the clock
    # where a 10 ms step no longer adds up (TPOT p50 0.0 at exit 0)
    ("replicas = 2\nrouter = \"role_affinity\"\nload_factor = 1e307", "fleet.load_factor = 1e+307"),
    ("[[fleet.faults]]\nreplica = 0\nat_s = 2.0\nfor_s = 1e16", "fleet.faults.0.for_s = 1e+16"),
    ("[[fleet.faults]]\nreplica = 0\nat_s = 1e16", "fleet.faults.0.at_s = 1e+16"),
])
def test_bad_fleet_input_is_one_line_and_exit_2(tmp_path, capsys, fleet, field):
    path = write(tmp_path, TOML + "[fleet]\n" + fleet + "\n")
    assert main(["run", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and path in err and field in err, err


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faults=faults, staleness=st.sampled_from([0.0, 0.5]))
def test_round_robin_routes_without_taking_views(faults, staleness):
    """Round robin reads only whether each replica is up, so the fleet takes no replica view for it
    (fails if every arrival still builds every replica's view) and routes exactly as with the full,
    possibly stale, views, whatever replicas go down and come back."""
    from unittest import mock

    from granisim.fleet.replica import Replica

    fl = [{"replica": r, "at_s": a, **({"for_s": d} if d is not None else {})} for r, a, d in faults]
    sc = scenario({"replicas": 3, "router": "round_robin", "faults": fl, "staleness_s": staleness},
                  num_requests=20, turns=2)
    taken = []
    view = Replica.view
    with mock.patch.object(Replica, "view", lambda self, now: taken.append(now) or view(self, now)):
        fast = run(sc)
        assert taken == []
        with mock.patch("granisim.fleet.loop.reads_only_up", lambda policy: False):
            full = run(sc)
        assert taken
    assert fleet_requests(fast).equals(fleet_requests(full))
    assert fleet_steps(fast).equals(fleet_steps(full))
    assert fast.rerouted == full.rerouted and fast.decisions == full.decisions


def test_a_request_handed_back_after_it_started_does_not_time_out_in_the_queue():
    """queue_timeout_s rejects requests that waited too long *without starting*; a replica's fault hands
    its running requests back to be recomputed elsewhere (nothing is dropped). Those came back as new
    waiting requests and were rejected as "waited over queue_timeout_s" on the next replica, their wait
    counted from their first arrival although they had been running since."""
    sc = scenario({"replicas": 2, "router": "round_robin", "faults": [{"replica": 0, "at_s": 1.5, "for_s": 1.0}]},
                  num_requests=40, rate=20.0, max_output_len=400)
    sc = sc.with_changes(**{"scheduler.queue_timeout_s": 1.0})
    reqs = fleet_requests(run(sc)).set_index("rid")
    assert reqs.rerouted[0] == 1  # started at t = 0 on idle replica 0 (400 outputs), handed back at 1.5
    assert reqs.status[0] == "completed", reqs.reason[0]
    check_nothing_lost(run(sc), 40, 1)


@pytest.mark.parametrize("head, group, want", [
    # catches: the group's policy refused by the host tier was reported as "<override>: field policy.host_tier"
    ("[hardware]\nhost_kv_gb = 1.0\n[policy]\nhost_tier = \"slabs\"\n", "policy = \"token\"",
     "field fleet.groups.1.policy = 'token': "),
    # catches: a group's profile without room for the KV cache blamed the scenario's field without the group
    ("[model]\nname = \"llama-3.1-70b\"\n[hardware]\nprofile = \"h200\"\ntp = 2\nreserve_gb = 10.0\n",
     "profile = \"a100-80gb\"", "field hardware.reserve_gb = 10.0: "),
])
def test_a_replica_groups_mistake_names_the_file_and_the_group(tmp_path, capsys, head, group, want):
    path = write(tmp_path, TOML + head + "[fleet]\n[[fleet.groups]]\nreplicas = 1\n[[fleet.groups]]\nreplicas = 1\n"
                 + group + "\n")
    assert main(["run", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {path}: ") and want in err, err
    assert "fleet.groups.1" in err and "<override>" not in err, err


def test_compare_policies_refuses_a_fleet_whose_groups_all_set_their_policy(tmp_path, capsys):
    """catches: with every [[fleet.groups]] entry naming its policy, `compare --policies granikv,token` ran the same
    fleet twice and printed identical rows labelled granikv and token, though no replica ran token; the fleet's
    summary named the scenario's [policy] (granikv) as the fleet's."""
    path = write(tmp_path, TOML + '[fleet]\n[[fleet.groups]]\nreplicas = 1\npolicy = "granikv"\n'
                 '[[fleet.groups]]\nreplicas = 1\npolicy = "paged16"\n')
    out = tmp_path / "c"
    assert main(["compare", path, "--policies", "granikv,token", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --policies granikv,token: ") and path in err, err
    assert not out.exists()
    # the scenario's own [policy] name too: its run would be labelled granikv, though a replica runs paged16
    assert main(["compare", path, "--policies", "granikv", "--out", str(out)]) == 2 and not out.exists()
    capsys.readouterr()
    assert main(["run", path, "--out", str(out)]) == 0  # the fleet as written
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "mixed" and [r["policy"] for r in summary["replicas"]] == ["granikv", "paged16"]


@pytest.mark.parametrize("fault, field", [("faults = [{replica = 0}]", "fleet.faults.0.at_s"),
                                          ("[[fleet.faults]]\nat_s = 1.0", "fleet.faults.0.replica")])
def test_a_fault_without_a_required_field_says_it_is_missing(tmp_path, capsys, fault, field):
    """catches: the line showed the whole fault table as the missing field's value
    ('field fleet.faults.0.at_s = {'replica': 0}: Field required')."""
    path = write(tmp_path, TOML + "[fleet]\nreplicas = 2\n" + fault + "\n")
    assert main(["run", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {path}: field {field}: missing (required)", err


@pytest.mark.parametrize("policy, groups, ok, blamed", [
    # catches: a tier of HOT slabs was checked against [policy] name although every group runs granikv
    ("token", ["granikv", "granikv"], True, None),
    ("granikv", ["granikv", "token"], False, "field fleet.groups.1.policy = 'token': under policy.host_tier"),
    ("token", ["token", "token"], False, "field fleet.groups.0.policy = 'token': under policy.host_tier"),
    ("token", ["granikv", None], False, "field policy.host_tier = 'slabs': policy token"),
    # with host_tier unset each replica's tier moves what its policy keeps: slabs under granikv, pages under token
    ("granikv", ["granikv", "token"], True, ""),
    ("token", ["granikv", None], True, ""),
])
def test_a_slabs_tier_is_checked_against_the_policies_replicas_run(tmp_path, capsys, policy, groups, ok, blamed):
    body = "".join("[[fleet.groups]]\nreplicas = 1\n" + (f'policy = "{g}"\n' if g else "") for g in groups)
    tier = "" if blamed == "" else 'host_tier = "slabs"\n'
    path = write(tmp_path, TOML + f'[hardware]\nhost_kv_gb = 1.0\n[policy]\nname = "{policy}"\n{tier}[fleet]\n'
                 + body)
    assert main(["run", path, "--out", str(tmp_path / "o")]) == (0 if ok else 2)
    err = capsys.readouterr().err.strip()
    assert ok or (len(err.splitlines()) == 1 and blamed in err), err


def test_a_fleet_that_finishes_nothing_still_plots_without_warnings(tmp_path):
    """Its only replica fails before the first step: every request is rejected, the steps table has its columns
    and no row, and the plots say so instead of warning about empty legends (matplotlib's UserWarning on the
    user's terminal). It used to write a steps table without columns and no plots, while saying it wrote them."""
    path = write(tmp_path, TOML + "[fleet]\nreplicas = 1\n[[fleet.faults]]\nreplica = 0\nat_s = 0.0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["run", path, "--out", str(tmp_path / "o")]) == 0
    reqs = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert (reqs.status == "rejected").all() and len(reqs) == 12
    steps = pd.read_parquet(tmp_path / "o" / "steps.parquet")
    assert len(steps) == 0 and {"replica", "incarnation", "start_s", "duration_s"} <= set(steps.columns)
    assert (tmp_path / "o" / "replicas.png").exists() and (tmp_path / "o" / "ttft_by_replica.png").exists()
