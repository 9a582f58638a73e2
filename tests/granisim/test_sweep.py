"""Sweeps: local processes and Ray agree; a killed sweep resumes losing nothing finished;
bad sweep files are rejected with one line."""

import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from granisim.cli import main
from granisim.experiments.sweep_results import ResultsStore
from granisim.experiments.sweep import run_sweep
from granisim.config.scenario import ScenarioError
from granisim.experiments.sweep_file import load_sweep

BASE = """
[base]
seed = 3
[base.workload]
roles = 2
prefix_len = 512
num_requests = {n}
rate = 20.0
max_output_len = 32
"""

SMALL = "name = 'small'\n" + BASE.format(n=16) + """
[[grid]]
"policy.name" = ["granikv"]
"policy.hot_fraction" = [0.1, 0.4, "adaptive"]
"workload.roles" = [1, 3]
[[grid]]
"policy.name" = ["token"]
"workload.roles" = [1, 3]
[speedup]
field = "policy.name"
target = "granikv"
baseline = "token"
"""


def _sweep(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _stable(df):
    return df.drop(columns=["sim_wall_s"]).sort_values("point_id").reset_index(drop=True)


def test_grid_union_listed_points_and_ids(tmp_path):
    spec = load_sweep(_sweep(tmp_path, SMALL))
    assert len(spec.points) == 8 and spec.varied == ["policy.name", "policy.hot_fraction", "workload.roles"]
    again = load_sweep(_sweep(tmp_path, SMALL, "other_name.toml"))
    assert [p.pid for p in again.points] == [p.pid for p in spec.points]  # ids depend on the scenario only
    text = "name='x'\n" + BASE.format(n=8) + """
[grid]
workload.roles = [1, 2]
[[points]]
"policy.name" = "token"
[[points]]
"policy.name" = "paged16"
"""
    spec = load_sweep(_sweep(tmp_path, text, "x.toml"))
    got = sorted((p.scenario.policy.name, p.scenario.workload.roles) for p in spec.points)
    assert got == [("paged16", 1), ("paged16", 2), ("token", 1), ("token", 2)]


def test_local_processes_and_ray_give_identical_results(tmp_path):
    ray = pytest.importorskip("ray")
    spec = load_sweep(_sweep(tmp_path, SMALL))
    local = run_sweep(spec, tmp_path / "local", workers=2, progress=False)
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as err:  # only a Ray that truly cannot start is a skip
        pytest.skip(f"Ray cannot start here: {err}")
    try:
        on_ray = run_sweep(spec, tmp_path / "ray", ray_address="local", progress=False)
    finally:
        ray.shutdown()
    assert len(local) == len(on_ray) == 8  # (adaptive HOT included: same results in other processes)
    pd.testing.assert_frame_equal(_stable(local), _stable(on_ray))
    assert (local.completed == 16).all()


def test_resume_after_kill_loses_nothing_finished(tmp_path):
    """A sweep killed after its 3rd finished point (the GRANISIM_TEST_CRASH_AFTER hook: the driver exits at
    once, no cleanup, as on SIGKILL) kept exactly those 3 rows; the resumed sweep runs only the other 9, leaves
    the 3 files untouched, and its table equals an uninterrupted run's. Planted bug: a resume that ignores
    finished rows (``done = set()`` in run_sweep) rewrites the 3 files and fails."""
    text = "name = 'killme'\n" + BASE.format(n=60) + """
[grid]
"policy.name" = ["granikv", "token"]
"workload.roles" = [1, 2, 3, 4, 5, 6]
"""
    path = _sweep(tmp_path, text)
    out = tmp_path / "out"
    parts = out / "results"
    env = {**os.environ, "GRANISIM_TEST_CRASH_AFTER": "3"}
    proc = subprocess.run([sys.executable, "-m", "granisim.cli", "sweep", str(path), "--out", str(out),
                           "--workers", "1"], env=env, capture_output=True, text=True)
    assert proc.returncode == 137, proc.stderr[-2000:]
    before = {p.name: p.stat().st_mtime_ns for p in parts.glob("part-*.parquet")}
    assert len(before) == 3, f"{len(before)} points on disk after a crash after the 3rd"
    assert len(ResultsStore(out).done_ids()) == 3
    spec = load_sweep(path)
    df = run_sweep(spec, out, workers=1, progress=False)
    after = {p.name: p.stat().st_mtime_ns for p in parts.glob("part-*.parquet")}
    assert len(df) == 12 and set(df.point_id) == {p.pid for p in spec.points}
    assert len(after) == 12
    assert all(after[name] == t for name, t in before.items()), "a finished point was run again"
    # and the resumed table equals an uninterrupted run
    fresh = run_sweep(spec, tmp_path / "fresh", workers=1, progress=False)
    pd.testing.assert_frame_equal(_stable(df), _stable(fresh))


@pytest.mark.parametrize("text,needle", [
    ('[grid]\n"workload.ratee" = [1, 2]\n', "unknown scenario field 'workload.ratee'"),
    ('[grid]\nworkload.rate = []\n', "field workload.rate = [] in grid: empty list of values (empty grid)"),
    ('name = "nothing"\n', "empty grid"),
    ('[grid]\n"workload.rate" = [1, -2]\n', "field workload.rate = -2"),
    ('[grid]\n"policy.name" = ["granikv", "vllm"]\n', "field policy.name = 'vllm'"),
    ('[grid]\n"model.name" = ["gpt-9"]\n', "field model.name = 'gpt-9'"),
    ('[grid]\n"workload.rate" = 3\n', "must be a list of values"),
    ('[grids]\n"workload.rate" = [3]\n', "unknown sweep key 'grids'"),
    ('[grid]\n"workload.time_scale" = [1.0, 2.0]\n', "grid field workload.time_scale: has no effect with Poisson"),
    ('set = { "policy.name" = "token" }\n[grid]\n"policy.hot_fraction" = [0.1, 0.4]\n',
     "grid field policy.hot_fraction: has no effect unless policy.name = 'granikv'"),
    ('[[points]]\n"policy.name" = "paged16"\n"policy.hot_fraction" = 0.1\n[[points]]\n"policy.name" = "token"\n'
     '"policy.hot_fraction" = 0.4\n', "points field policy.hot_fraction: has no effect unless policy.name = 'granikv'"),
    ('[grid]\n"fleet.router" = ["round_robin", "hot_aware"]\n', "grid field fleet.router: one replica"),
    ('[grid]\n"name" = ["a", "b"]\n', "grid field name: names the run's output"),
    ('[grid]\n"seed" = [1, 2, 1]\n', "field seed = [1, 2, 1] in grid: the value 1 is listed twice"),
    ('[[points]]\nseed = 1\n[[points]]\nseed = 2\n[[points]]\nseed = 1\n', "points #3 = {'seed': 1}: the same as points #1"),
])
def test_bad_sweep_files_exit_2_with_one_line(tmp_path, capsys, text, needle):
    path = _sweep(tmp_path, text)
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and str(path) in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o" / "results").exists() or not list((tmp_path / "o" / "results").iterdir())


def test_cli_sweep_writes_table_and_plots(tmp_path):
    text = "name = 'cli'\n" + BASE.format(n=10) + """
[grid]
"policy.name" = ["granikv", "token"]
"workload.prefix_len" = [256, 512]
"scheduler.max_running" = [8, 32]
[speedup]
[[plot]]
kind = "heatmap"
x = "workload.prefix_len"
y = "scheduler.max_running"
[[plot]]
kind = "line"
x = "workload.prefix_len"
value = "throughput_rps"
"""
    out = tmp_path / "o"
    assert main(["sweep", str(_sweep(tmp_path, text)), "--out", str(out), "--workers", "1"]) == 0
    assert len(ResultsStore(out).read()) == 8
    sp = pd.read_csv(out / "speedup.csv")
    assert len(sp) == 4 and sp.speedup.notna().all()
    assert len(list(out.glob("heatmap_*.png"))) == 1 and len(list(out.glob("line_*.png"))) == 1
    # a second run finds everything done
    assert main(["sweep", str(out.parent / "s.toml"), "--out", str(out), "--workers", "1"]) == 0


@pytest.mark.parametrize("address, needle", [
    ("127.0.0.1:1", "nothing reachable"),
    # catches: an address Ray cannot parse was its bare ValueError, "error: Invalid address format: nonsense"
    ("nonsense", "cannot connect to a Ray cluster (Invalid address format: nonsense)"),
])
def test_unreachable_ray_address_is_one_line(tmp_path, capsys, address, needle):
    path = _sweep(tmp_path, "name = 'r'\n" + BASE.format(n=4) + '[grid]\n"workload.roles" = [1]\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--ray", address]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: --ray {address}: {needle}") and "Traceback" not in "".join(err)


def test_a_failing_point_is_reported_and_the_rest_kept(tmp_path, monkeypatch):
    import granisim.experiments.sweep as sweep_mod

    spec = load_sweep(_sweep(tmp_path, "name = 'f'\n" + BASE.format(n=6) + '[grid]\n"workload.roles" = [1, 2, 3]\n'))
    real, bad = sweep_mod.run_point, spec.points[1].pid

    def flaky(pid, *a):
        if pid == bad:
            raise RuntimeError("boom\nsecond line")
        return real(pid, *a)

    monkeypatch.setattr(sweep_mod, "run_point", flaky)
    df = run_sweep(spec, tmp_path / "o", workers=1, progress=False)
    assert len(df) == 2 and bad not in set(df.point_id)
    import json
    fails = json.loads((tmp_path / "o" / "failures.json").read_text())
    assert [f["point_id"] for f in fails] == [bad] and fails[0]["error"] == "RuntimeError: boom"
    monkeypatch.setattr(sweep_mod, "run_point", real)
    assert len(run_sweep(spec, tmp_path / "o", workers=1, progress=False)) == 3
    assert not (tmp_path / "o" / "failures.json").exists()


def test_paper_with_a_failing_point_says_which_and_exits_1(tmp_path, monkeypatch, capsys):
    """Every claim needs every point: a point that raises ends `granisim paper` with the sweep's failure lines
    (exit 1), not with a traceback from the claims table."""
    import granisim.experiments.sweep as sweep_mod

    def broken(pid, *a):
        raise RuntimeError("boom")

    monkeypatch.setattr(sweep_mod, "run_point", broken)
    rc = main(["paper", "--profiles", "h200", "--out", str(tmp_path / "p"), "--num-requests", "2", "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "RuntimeError: boom" in err and "failures.json" in err and "0 of " in err


def test_sweep_command_with_a_failing_point_says_which_and_exits_1(tmp_path, monkeypatch, capsys):
    import granisim.experiments.sweep as sweep_mod

    path = _sweep(tmp_path, "name = 'f'\n" + BASE.format(n=6) + '[grid]\n"workload.roles" = [1, 2]\n')
    real, bad = sweep_mod.run_point, load_sweep(path).points[0].pid
    monkeypatch.setattr(sweep_mod, "run_point", lambda pid, *a: (_ for _ in ()).throw(RuntimeError("boom"))
                        if pid == bad else real(pid, *a))
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line and "%|" not in line]  # not the bar
    assert len(err) == 2 and err[0].startswith(f"error: point {bad} ") and err[0].endswith("RuntimeError: boom")
    assert err[1].startswith("1 point(s) failed") and err[1].endswith("1 of 2 done")


def test_a_field_at_its_default_has_its_value_in_the_table_and_in_plot_filters(tmp_path):
    """catches: fields the scenario dump leaves out at their default (hardware.tp = 1, host_kv_gb = 0, ...) read
    NaN in the results table, and a [speedup] or plot `where` on one of them was a KeyError traceback."""
    text = "name = 'tp'\n" + BASE.format(n=8) + """
[grid]
"hardware.tp" = [1, 2]
"policy.name" = ["granikv", "token"]
[speedup]
field = "hardware.tp"
target = 2
baseline = 1
[[plot]]
kind = "line"
x = "policy.name"
value = "throughput_rps"
where = { "hardware.tp" = 1 }
"""
    out = tmp_path / "o"
    assert main(["sweep", str(_sweep(tmp_path, text)), "--out", str(out), "--workers", "1"]) == 0
    df = pd.read_csv(out / "results.csv")
    assert sorted(df["hardware.tp"]) == [1, 1, 2, 2]
    assert (df["hardware.host_kv_gb"] == 0).all() and (df["hardware.step_time_scale"] == 1).all()
    # unset, it reads what a tier would move under each point's policy
    assert list(df.sort_values("policy.name")["policy.host_tier"]) == ["slabs", "slabs", "slabs+pages", "slabs+pages"]
    speedup = pd.read_csv(out / "speedup.csv")
    assert len(speedup) == 2 and speedup.speedup.notna().all()


HOST_BASE = BASE.format(n=6) + "[base.hardware]\nhost_kv_gb = 1.0\n"


def test_a_value_valid_only_beside_its_point_s_other_values(tmp_path):
    """catches: every grid value was checked alone against the base before the points, so `policy.name = 'token'`
    over a base with a host tier was refused (host_tier 'slabs' needs HOT slabs) although its every point sets
    policy.host_tier = 'slabs+pages' (and the same for a [speedup] baseline some point has)."""
    text = "name = 'host'\n" + HOST_BASE + """
[grid]
"policy.name" = ["granikv", "token"]
"policy.host_tier" = ["slabs+pages"]
[speedup]
"""
    spec = load_sweep(_sweep(tmp_path, text))
    assert sorted(p.scenario.policy.name for p in spec.points) == ["granikv", "token"]
    bad = ("name = 'host'\n" + HOST_BASE + '[base.policy]\nhost_tier = "slabs"\n'
           + '[grid]\n"policy.name" = ["granikv", "token"]\n')
    with pytest.raises(ScenarioError, match=r"policy.host_tier = 'slabs': policy token .* \(in grid\)"):
        load_sweep(_sweep(tmp_path, bad))  # a point that is invalid still names the value that makes it so


def test_host_copy_s_is_a_metric_of_a_sweep_with_a_host_tier(tmp_path):
    """catches: docs/scenarios.md lists host_copy_s among the metrics [speedup] and [[plot]] may name, and points
    with a host tier write it, but the sweep file refused it as 'not a results metric'."""
    text = "name = 'hc'\n" + HOST_BASE + """
[grid]
"policy.name" = ["granikv", "token"]
"policy.host_tier" = ["slabs+pages"]
[speedup]
metric = "host_copy_s"
[[plot]]
kind = "line"
x = "policy.name"
value = "host_copy_s"
"""
    spec = load_sweep(_sweep(tmp_path, text))
    assert spec.speedup.metric == "host_copy_s" and spec.plots[0].value == "host_copy_s"
    without = text.replace("[base.hardware]\nhost_kv_gb = 1.0\n", "").replace(
        '"policy.host_tier" = ["slabs+pages"]\n', "")
    with pytest.raises(ScenarioError, match="speedup.metric = 'host_copy_s': .*no point has hardware.host_kv_gb > 0"):
        load_sweep(_sweep(tmp_path, without))


def test_a_varied_field_acting_at_some_point_is_accepted(tmp_path):
    """A grid field is refused only where it acts at no point (time_scale under Poisson arrivals: every point the
    same, as a scenario file refuses it); a product grid in which it acts at some points is accepted. Planted: the
    check run on each point alone refused this grid (host_tier is inert where host_kv_gb = 0)."""
    text = "name = 'mixed'\n" + BASE.format(n=8) + """
[grid]
"hardware.host_kv_gb" = [0.0, 1.0]
"policy.host_tier" = ["slabs", "slabs+pages"]
"""
    spec = load_sweep(_sweep(tmp_path, text))
    assert len(spec.points) == 4


def test_hot_fraction_is_refused_only_where_no_point_runs_granikv(tmp_path):
    """policy.hot_fraction sizes granikv's HOT pool; token and paged have none, so a sweep over it under those
    policies alone lists distinct points with identical results, and is refused (above). Where a point runs granikv
    it is accepted. A scenario file that sets it under token is refused when run as written, but loads as the base
    of a sweep whose grid runs granikv (there it acts), and is refused as a base where no point does. Planted:
    checking the base's hot_fraction against the base alone (not the points) refused the first base sweep here."""
    from granisim.config.scenario import load_scenario

    text = "name = 'hot'\n" + BASE.format(n=8) + """
[grid]
"policy.name" = ["granikv", "token"]
"policy.hot_fraction" = [0.1, 0.4]
"""
    assert len(load_sweep(_sweep(tmp_path, text)).points) == 4
    sc = tmp_path / "token_hot.toml"
    sc.write_text('[policy]\nname = "token"\nhot_fraction = 0.3\n[workload]\nnum_requests = 4\n')
    with pytest.raises(ScenarioError, match=re.escape("token_hot.toml: field policy.hot_fraction = 0.3: has no "
                                                      "effect unless policy.name = 'granikv'")):
        load_scenario(sc)
    over = "name = 'b'\nbase = 'token_hot.toml'\n[grid]\n\"policy.name\" = [{}]\n"
    spec = load_sweep(_sweep(tmp_path, over.format('"granikv", "token"'), "b.toml"))
    assert {p.scenario.policy.hot_fraction for p in spec.points} == {0.3}
    with pytest.raises(ScenarioError, match=re.escape("field base = 'token_hot.toml': ") + ".*" + re.escape(
            "field policy.hot_fraction = 0.3: has no effect unless policy.name = 'granikv'") + ".*at every point"):
        load_sweep(_sweep(tmp_path, over.format('"token", "paged16"'), "b.toml"))


def test_speedup_pairs_each_target_with_the_baseline_of_its_own_grid(tmp_path):
    """Baselines from two [[grid]] tables (one at the base's rate, one at another) are told apart: each granikv
    row is divided by the token row at its own rate. Planted: matching only on the fields every baseline row
    overrides (policy.name alone here) divided both granikv rows by the mean of the two token rows."""
    from granisim.experiments.sweep_plots import add_speedup

    text = "name = 'two'\n" + BASE.format(n=12) + """
[[grid]]
"policy.name" = ["granikv", "token"]
[[grid]]
"policy.name" = ["granikv", "token"]
"workload.rate" = [2.0]
[speedup]
field = "policy.name"
target = "granikv"
baseline = "token"
"""
    spec = load_sweep(_sweep(tmp_path, text))
    df = run_sweep(spec, tmp_path / "o", workers=1, progress=False)
    got = add_speedup(df, spec.speedup, spec.varied).set_index("workload.rate")
    token = df[df["policy.name"] == "token"].set_index("workload.rate")["throughput_rps"]
    assert token[2.0] != token[20.0]
    for rate in (2.0, 20.0):
        assert got.loc[rate, "baseline_throughput_rps"] == token[rate]


@pytest.mark.parametrize("base, grid, want", [
    # catches: the up-front check ran once per model, hardware and prefix length, so a second policy's pool split
    # (a page larger than the budget) failed only when its point ran
    ("[base.hardware]\nkv_budget_tokens = 3000\n", '"policy.name" = ["granikv", "paged4096"]',
     "field policy.name = 'paged4096': the KV budget of 3000 tokens"),
    # ... and a fleet's faults were never checked against the fleet's size at each point
    ("[base.fleet]\nreplicas = 2\n[[base.fleet.faults]]\nreplica = 1\nat_s = 0.5\n", '"fleet.replicas" = [2, 1]',
     "field fleet.faults.0.replica = 1: the fleet has replicas 0..0"),
])
def test_every_point_is_resolved_before_anything_runs(tmp_path, base, grid, want):
    text = "name = 'x'\n" + BASE.format(n=8) + base + "[grid]\n" + grid + "\n"
    with pytest.raises(ScenarioError, match=re.escape(want)):
        load_sweep(_sweep(tmp_path, text))


def test_a_damaged_results_part_says_how_to_recompute_its_point(tmp_path, capsys):
    """catches: a part that is not parquet (written over by something else) stopped every later run with pyarrow's
    own message, which did not say that deleting the part lets the sweep recompute that point."""
    path = _sweep(tmp_path, "name = 'dmg'\n" + BASE.format(n=4) + '[grid]\n"policy.name" = ["granikv", "token"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    part = sorted((out / "results").glob("part-*.parquet"))[0]
    part.write_text("garbage")
    capsys.readouterr()
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(part) in err[0] and "delete it" in err[0], err
    part.unlink()
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1"]) == 0
    assert len(pd.read_csv(out / "results.csv")) == 2


def test_a_speedup_of_an_integer_written_for_a_float_field_finds_its_points(tmp_path):
    """catches: `target = 3` over `workload.rate = [1.0, 3.0]` was refused ('no point has workload.rate = 3'),
    values compared as text, where a grid takes 3 for 3.0."""
    text = ("name = 'sp'\n" + BASE.format(n=4) + '[grid]\n"workload.rate" = [1.0, 3.0]\n'
            '[speedup]\nfield = "workload.rate"\ntarget = 3\nbaseline = 1\n')
    out = tmp_path / "o"
    assert main(["sweep", str(_sweep(tmp_path, text)), "--out", str(out), "--workers", "1"]) == 0
    sp = pd.read_csv(out / "speedup.csv")
    assert list(sp["workload.rate"]) == [3.0] and sp.speedup.notna().all()
