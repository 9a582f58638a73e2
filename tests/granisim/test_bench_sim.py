"""granisim bench sim: the trace repetition, one measurement, the table and bad arguments."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from granisim.experiments import bench_sim


ROOT = Path(__file__).resolve().parents[2]


def test_the_cases_scenarios_ship_with_the_package_as_copies_of_scenarios():
    """The packaged copies (granisim/config/scenarios/, package data) are byte-identical to scenarios/*.toml, so
    the benchmark times the scenarios the reports name. Planted bug: editing scenarios/azure_replay.toml alone."""
    names = sorted({c.scenario for c in bench_sim.CASES.values()})
    assert names == ["azure_replay.toml", "multi_agent_16k.toml"]
    for name in names:
        packaged = ROOT / "granisim" / "config" / "scenarios" / name
        assert packaged.read_bytes() == (ROOT / "scenarios" / name).read_bytes(), name


def test_the_benchmark_runs_from_the_package_alone(tmp_path):
    """catches: the cases' scenarios were read from ROOT / "scenarios", a folder of the checkout that an installed
    granisim (`pip install .`, run from another folder) does not have: `granisim bench sim` failed with "cannot read
    scenario file". Here the package is copied alone (no scenarios/ beside it) and imported from there."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "granisim", site / "granisim", ignore=shutil.ignore_patterns("__pycache__"))
    code = (
        "from granisim.experiments import bench_sim as b\n"
        f"assert b.__file__.startswith({str(site)!r}), b.__file__\n"
        "err = b._policy_error(list(b.CASES), 'granikv')\n"
        "assert err is None, err\n"
        "b.CASES['tiny'] = b.Case('multi_agent_16k.toml', (('workload.num_requests', 4),))\n"
        "print(b.measure('tiny', 'granikv')['requests'], b._commit())\n")
    run = tmp_path / "elsewhere"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    got = subprocess.run([sys.executable, "-c", code], cwd=run, env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["4", "unknown"]


def test_repeat_trace_puts_copies_back_to_back_one_mean_gap_apart():
    tr = pd.DataFrame({"arrived_at": [10.0, 11.0, 14.0], "num_prefill_tokens": [5, 6, 7], "num_decode_tokens": [1, 2, 3]})
    got = bench_sim.repeat_trace(tr, 3)
    assert got.arrived_at.tolist() == [10, 11, 14, 16, 17, 20, 22, 23, 26]  # period 4 * 3 / 2 = 6
    assert got.num_prefill_tokens.tolist() == [5, 6, 7] * 3 and got.index.tolist() == list(range(9))
    assert (np.diff(got.arrived_at) > 0).all()
    assert bench_sim.repeat_trace(tr, 1) is tr


def test_one_measurement_reports_its_figures(monkeypatch):
    monkeypatch.setitem(bench_sim.CASES, "tiny", bench_sim.Case(
        "azure_replay.toml", (("workload.num_requests", 12),), copies=2))
    got = bench_sim.measure("tiny", "granikv")
    assert got["case"] == "tiny" and got["requests"] == 12 and got["plans"] > 0
    assert got["cpu_s"] > 0 and got["speed_x_real_time"] == pytest.approx(got["simulated_s"] / got["cpu_s"])
    assert got["peak_rss_mb"] > 10
    line = bench_sim.format_table([got]).splitlines()[1]
    assert line.startswith("tiny") and " 12 " in line


@pytest.mark.parametrize("argv, msg", [(["--cases", "azure_replay,nope"], "unknown case 'nope'"),
                                        (["--repeats", "0"], "--repeats: must be >= 1, got 0"),
                                        (["--cases", "azure_replay", "--policy", "nope"],
                                         "--policy: <override>: field policy.name = 'nope'"),
                                        (["--cases", "azure_replay", "--out", "."], "--out: '.' is a folder")])
def test_bad_arguments_exit_2_with_one_line(argv, msg, capsys):
    assert bench_sim.main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_baseline_must_be_a_checkout(tmp_path, capsys):
    assert bench_sim.main(["--cases", "azure_replay", "--baseline", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--baseline" in err and str(tmp_path) in err and err.count("\n") == 1


def test_baseline_runs_alternate_and_give_the_ratio_of_medians(monkeypatch, tmp_path):
    """Runs alternate baseline, this, baseline, this...; the ratio is of the two medians. Planted bug
    this catches: running all baseline repeats first (the order differs), or dividing this by the
    baseline (the ratio is inverted)."""
    calls = []
    cpu = {None: iter([1.0, 3.0, 2.0]), "B": iter([8.0, 4.0, 6.0])}

    def fake(name, policy, router="round_robin", code=None):
        calls.append(code)
        return {"case": name, "requests": 10, "simulated_s": 100.0, "plans": 5, "steps": 9,
                "cpu_s": next(cpu[code]), "wall_s": 1.0, "speed_x_real_time": 1.0, "peak_rss_mb": 100.0,
                "bytes_per_request": 1.0, "load_avg_1m": 0.5}

    monkeypatch.setattr(bench_sim, "_run_child", fake)
    rep = bench_sim.run(tmp_path / "o.json", ["azure_replay"], 3, baseline="B")
    assert calls == ["B", None] * 3
    assert rep["cases"][0]["cpu_s"] == 2.0 and rep["baseline"]["cases"][0]["cpu_s"] == 6.0
    assert rep["baseline"]["speedup"]["azure_replay"]["cpu_s_ratio"] == 3.0
    assert rep["baseline"]["speedup"]["azure_replay"]["same_plans"] is True


@pytest.mark.parametrize("what", ["alloc", "sweep", "sim"])
def test_granisim_bench_refuses_an_out_folder_before_it_runs(what, tmp_path, monkeypatch, capsys):
    """catches: README showed `granisim bench ... [--out DIR]`; a folder ran the whole benchmark, then failed
    writing its JSON report ('Is a directory')."""
    from granisim.cli import main
    from granisim.experiments import bench_alloc, bench_sweep

    for mod in (bench_alloc, bench_sweep, bench_sim):
        monkeypatch.setattr(mod, "run", lambda *a, **k: pytest.fail("the benchmark ran"))
    assert main(["bench", what, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {tmp_path}: a folder") and err.count("\n") == 1
    (tmp_path / "afile").write_text("")  # catches: under a file it ran the benchmark, then failed 'File exists'
    assert main(["bench", what, "--out", str(tmp_path / "afile" / "b.json")]) == 2
    err = capsys.readouterr().err
    assert "afile is a file, not a folder" in err and err.count("\n") == 1


def test_granisim_bench_sim_takes_repeats(tmp_path, monkeypatch, capsys):
    """catches: reports/sim_speed/README.md reproduces its fleet series with `granisim bench sim --fleet --repeats
    1`, which the CLI refused (unrecognized arguments); sweep, which repeats nothing, refuses it in one line."""
    from granisim.cli import main

    got = {}
    monkeypatch.setattr(bench_sim, "run", lambda out, cases, repeats, router: got.update(
        out=out, cases=cases, repeats=repeats, router=router))
    out = str(tmp_path / "f.json")
    assert main(["bench", "sim", "--fleet", "--repeats", "1", "--out", out]) == 0
    assert got == {"out": out, "cases": bench_sim.FLEET_CASES, "repeats": 1, "router": "round_robin"}
    assert main(["bench", "sim", "--out", out]) == 0 and got["repeats"] == 3
    assert main(["bench", "sweep", "--repeats", "2", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --repeats 2: for bench alloc and sim") and err.count("\n") == 1


@pytest.mark.parametrize("argv, says", [(["sweep", "--fleet"], "--fleet: for bench sim"),
                                        (["alloc", "--points", "3"], "--points 3: for bench sweep"),
                                        (["sim", "--workers", "2"], "--workers 2: for bench sweep")])
def test_granisim_bench_refuses_another_benchmarks_options(argv, says, tmp_path, monkeypatch, capsys):
    """catches: `bench sweep --fleet --router cache_aware` and `bench alloc --points 3` ran, the options ignored."""
    from granisim.cli import main
    from granisim.experiments import bench_alloc, bench_sweep

    for mod in (bench_alloc, bench_sweep, bench_sim):
        monkeypatch.setattr(mod, "run", lambda *a, **k: pytest.fail("the benchmark ran"))
    assert main(["bench", *argv, "--out", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err

