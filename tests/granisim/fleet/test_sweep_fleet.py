"""Sweeps and the capacity rate search simulate a [fleet] section as the fleet, not one GPU."""

import json
import re

import pytest

from granisim.cli import main
from granisim.config.scenario import ScenarioError
from granisim.experiments.sweep import run_sweep
from granisim.experiments.sweep_file import load_sweep

BASE = """
seed = 3
[{p}workload]
roles = 4
prefix_len = 512
num_requests = 40
rate = 40.0
max_output_len = 16
[{p}fleet]
replicas = 3
"""

KEYS = ("completed", "throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
        "prefix_hit_rate", "num_replicas", "router")


def test_a_sweep_over_the_router_gives_the_figures_of_granisim_run(tmp_path):
    """Fails on the old simulate_scenario (one GPU for every point: no `router`, other figures)."""
    sweep = tmp_path / "s.toml"
    sweep.write_text("name = 'routers'\n[base]\n" + BASE.format(p="base.")
                     + '[grid]\n"fleet.router" = ["round_robin", "hot_aware"]\n')
    rows = run_sweep(load_sweep(str(sweep)), tmp_path / "sw", workers=1, progress=False)
    assert len(rows) == 2
    for router in ("round_robin", "hot_aware"):
        sc = tmp_path / f"{router}.toml"
        sc.write_text(f"name = '{router}'\n" + BASE.format(p="") + f'router = "{router}"\n')
        assert main(["run", str(sc), "--out", str(tmp_path / router)]) == 0
        want = json.loads((tmp_path / router / "summary.json").read_text())
        got = rows[rows["fleet.router"] == router].iloc[0]
        assert want["num_replicas"] == 3
        for k in KEYS:
            assert got[k] == want[k], (router, k)
    a, b = (rows[rows["fleet.router"] == r].iloc[0] for r in ("round_robin", "hot_aware"))
    assert a.prefix_hit_rate != b.prefix_hit_rate  # the router mattered


def test_speedup_and_plots_may_name_the_fleet_fields_a_sweep_varies(tmp_path):
    """catches: the schema's fleet table is optional (`FleetCfg | None`), so the fields [speedup] and [[plot]] may
    name listed only `fleet`, and `[speedup] field = "fleet.router"` or a plot by `fleet.replicas` was refused as
    'not a scenario field' although the grid varied exactly that field."""
    sweep = tmp_path / "s.toml"
    sweep.write_text("name = 'routers'\n[base]\n" + BASE.format(p="base.")
                     + '[grid]\n"fleet.router" = ["round_robin", "hot_aware"]\n"fleet.replicas" = [1, 2]\n'
                     + '[speedup]\nfield = "fleet.router"\ntarget = "hot_aware"\nbaseline = "round_robin"\n'
                     + '[[plot]]\nkind = "line"\nx = "fleet.replicas"\ny = "fleet.router"\nvalue = "speedup"\n'
                     + 'where = { "fleet.router" = "hot_aware" }\n')
    spec = load_sweep(str(sweep))
    assert spec.speedup.field == "fleet.router" and spec.plots[0].x == "fleet.replicas"
    single = tmp_path / "one.toml"  # a point without [fleet] still has one `fleet` column, as before
    single.write_text("name = 'one'\n[base]\n" + BASE.format(p="base.").split("[base.fleet]")[0]
                      + '[grid]\n"policy.name" = ["granikv", "token"]\n')
    rows = run_sweep(load_sweep(str(single)), tmp_path / "sw", workers=1, progress=False)
    assert "fleet" in rows and not any(c.startswith("fleet.") for c in rows.columns)


def test_hot_fraction_acts_where_a_replica_group_runs_granikv(tmp_path):
    """catches: a sweep over policy.hot_fraction was refused as acting at no point when [policy] is token, although
    a [[fleet.groups]] entry runs granikv, whose HOT pool it sizes."""
    sweep = tmp_path / "s.toml"
    sweep.write_text("name = 'hot'\n[base]\n" + BASE.format(p="base.").replace("replicas = 3\n", "")
                     + '[base.policy]\nname = "token"\n[[base.fleet.groups]]\nreplicas = 1\n'
                     + '[[base.fleet.groups]]\nreplicas = 1\npolicy = "granikv"\n'
                     + '[grid]\n"policy.hot_fraction" = [0.05, 0.5]\n')
    spec = load_sweep(str(sweep))
    assert sorted(p.scenario.policy.hot_fraction for p in spec.points) == [0.05, 0.5]


def test_the_rate_search_runs_a_fleet_whose_groups_all_set_their_policy_once(tmp_path, capsys):
    """catches: without --policies the rate search ran such a fleet once per default policy (granikv, token,
    paged16), three identical searches labelled with policies no replica ran."""
    sc = tmp_path / "g.toml"
    sc.write_text("name = 'g'\n" + BASE.format(p="").replace("replicas = 3\n", "")
                  + '[[fleet.groups]]\nreplicas = 1\npolicy = "granikv"\n[[fleet.groups]]\nreplicas = 1\n'
                  + 'policy = "token"\n')
    out = tmp_path / "cap"
    assert main(["capacity", str(sc), "--slo", "ttft_p99=5s", "--max-probes", "2", "--workers", "1",
                 "--out", str(out)]) == 0
    got = json.loads((out / "capacity.json").read_text())
    assert [r["policy"] for r in got["results"]] == ["granikv"], got["results"]
    assert main(["capacity", str(sc), "--slo", "ttft_p99=5s", "--policies", "token,paged16"]) == 2
    assert "every [[fleet.groups]] entry" in capsys.readouterr().err


@pytest.mark.parametrize("base, grid, field", [
    ("[base.policy]\nname = 'paged16'\n", '"policy.page_size" = [4, 32]', "policy.page_size"),
    ("", '"fleet.cache_threshold" = [0.1, 0.9]', "fleet.cache_threshold"),
    ("", '"fleet.load_factor" = [1.0, 3.0]', "fleet.load_factor"),
    ("", '"fleet.rebalance_every" = [1, 64]', "fleet.rebalance_every"),
    ("", '"fleet.balance_abs" = [0, 64]', "fleet.balance_abs"),
    ("", '"fleet.staleness_s" = [0.0, 10.0]', "fleet.staleness_s"),
])
def test_a_sweep_over_a_field_that_acts_at_no_point_is_refused(tmp_path, base, grid, field):
    """catches: the page size beside paged16, or a router parameter under a router that reads none of it (here
    round_robin), was swept into distinct points with identical results, as policy.hot_fraction under token is
    refused for."""
    sweep = tmp_path / "s.toml"
    sweep.write_text("name = 'x'\n[base]\n" + BASE.format(p="base.") + base + "[grid]\n" + grid + "\n")
    with pytest.raises(ScenarioError, match=re.escape(f"grid field {field}: has no effect")):
        load_sweep(str(sweep))
    routers = '"fleet.router" = ["round_robin", "cache_aware", "role_affinity", "hot_aware"]\n'
    policies = '"policy.name" = ["paged16", "paged"]\n'
    sweep.write_text("name = 'x'\n[base]\n" + BASE.format(p="base.") + base + "[grid]\n" + grid + "\n"
                     + (policies if field == "policy.page_size" else routers))
    assert load_sweep(str(sweep)).points  # acting at some point: accepted
