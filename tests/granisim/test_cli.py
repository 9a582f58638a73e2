"""The CLI: bad input gives one line naming file, field and value, exit 2, no traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from granisim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, text):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,needle", [
    ("[workload]\nratee = 3\n", "unknown field 'workload.ratee'"),
    ("[workload]\nrate = 'fast'\n", "field workload.rate = 'fast'"),
    ("[workload]\nrate = -2\n", "field workload.rate = -2"),
    ("[policy]\nhot_fraction = 1.5\n", "field policy.hot_fraction = 1.5"),
    ("[policy]\nname = 'vllm'\n", "field policy.name = 'vllm'"),
    ("[model]\nname = 'gpt-9'\n", "field model.name = 'gpt-9'"),
    ("[hardware]\nprofile = 'tpu-v9'\n", "field hardware.profile = 'tpu-v9'"),
    ("[hardware]\nkv_budget_tokens = 1000\n[workload]\nprefix_len = 16384\n",
     "field hardware.kv_budget_tokens = 1000 is too small for one request"),
    ("[workload]\ntrace = '/nonexistent/trace.csv'\n", "field workload.trace = '/nonexistent/trace.csv': file not found"),
    ("this is = = not toml", "not valid TOML"),
    # sizes that would run out of memory or time before the first step (they hung)
    ("[workload]\nroles = 100000000\n", "field workload.roles = 100000000"),
    ("[workload]\nroles = 100000\nprefix_len = 16384\n", "field workload.roles = 100000: 100000 roles x prefix_len"),
    ("[fleet]\nreplicas = 100000000\n", "field fleet.replicas = 100000000"),
    ("name = '.'\n", "field name = '.': names the output folder (out/NAME) itself"),
    ('name = "a\\nb"\n', "field name = 'a\\nb': a control character"),
    ('name = "a\\u0000b"\n', "field name = 'a\\x00b': a control character"),
    ("[fleet]\n[[fleet.groups]]\nreplicas = 4000\n[[fleet.groups]]\nreplicas = 4000\n", "8000 replicas; at most 4096"),
])
def test_bad_scenarios_exit_2_with_one_line(tmp_path, capsys, text, needle):
    path = _write(tmp_path, text)
    assert main(["run", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err, err
    assert path in err or "tpu-v9" in err or "gpt-9" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_profile_whose_memory_holds_too_many_kv_slots_exits_2(tmp_path, capsys):
    """A user profile with memory_bytes = 1e15 leaves 6.9G KV slots for Llama-3.1-8B: refused before the
    allocator tries to list them (it raised numpy's out-of-memory error)."""
    prof = tmp_path / "big.json"
    assert main(["profile", "derive", "h200", "--out", str(prof)]) == 0
    data = json.loads(prof.read_text())
    data["coefficients"]["memory_bytes"] = {"value": 1e15, "unit": "B", "source": {"kind": "published",
                                                                                 "citation": "a test"}}
    prof.write_text(json.dumps(data))
    capsys.readouterr()
    path = _write(tmp_path, f"[hardware]\nprofile = '{prof}'\n[workload]\nnum_requests = 5\n")
    assert main(["run", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"field hardware.profile = '{prof}'" in err and "more than the 1,073,741,824 KV slots" in err, err
    assert len(err.splitlines()) == 1


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made")
def test_an_out_folder_that_cannot_be_made_names_the_option(tmp_path, capsys):
    path = _write(tmp_path, "[workload]\nnum_requests = 3\n")
    assert main(["run", path, "--out", "/proc/granisim-test/o"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out /proc/granisim-test/o: cannot write /proc/granisim-test"), err
    assert len(err.splitlines()) == 1


def test_an_infinite_rate_bound_is_refused_as_not_finite(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["capacity", _write(tmp_path, ""), "--slo", "ttft_p99=2s", "--hi", "inf"])
    assert stop.value.code == 2
    assert "argument --hi: inf must be a finite number > 0" in capsys.readouterr().err


def test_missing_scenario_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml")]) == 2
    assert "cannot read scenario file" in capsys.readouterr().err


def test_run_writes_outputs(tmp_path):
    path = _write(tmp_path, "[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 20\nrate = 5.0\n"
                            "max_output_len = 16\n")
    out = tmp_path / "out"
    assert main(["run", path, "--out", str(out)]) == 0
    for f in ("requests.parquet", "steps.parquet", "summary.json", "latency_cdf.png", "occupancy_batch.png",
              "trace.json"):
        assert (out / f).exists(), f
    assert json.loads((out / "summary.json").read_text())["completed"] == 20
    trace = json.loads((out / "trace.json").read_text())
    assert trace["traceEvents"]


def _strict(text: str):
    def refuse(const):
        raise ValueError(f"{const} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_figure_with_no_value_is_null_in_strict_json(tmp_path):
    """Outputs of one token leave no TPOT: its percentiles are written ``null`` (strict JSON), in summary.json
    and in compare.json, for one run and for a fleet. Planted bug: ``json.dumps`` as it was writes ``NaN``,
    which a strict reader (the parse_constant hook here, jq, a browser) refuses."""
    body = "[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 6\nrate = 5.0\nmax_output_len = 1\n"
    for name, text, argv in (("one", body, ["run"]), ("fleet", body + "[fleet]\nreplicas = 2\n", ["run"]),
                             ("cmp", body, ["compare", "--policies", "granikv,token"])):
        (tmp_path / name).mkdir()
        path = _write(tmp_path / name, text)
        out = tmp_path / name / "out"
        assert main([argv[0], path, "--out", str(out), *argv[1:]]) == 0
        files = [out / "summary.json"] if argv == ["run"] else [out / "compare.json"]
        for f in files:
            data = _strict(f.read_text())
            figures = data if argv == ["run"] else data["granikv"]
            assert figures["completed"] == 6 and figures["tpot_p50_s"] is None and figures["ttft_p50_s"] > 0


def test_a_run_with_no_step_plots_without_warnings(tmp_path):
    """A run in which nothing ran (every request rejected) draws its occupancy panel with a note, not an empty
    legend: matplotlib's UserWarning reached the user's terminal."""
    import warnings

    import pandas as pd

    from granisim.core.metrics import StepLog
    from granisim.experiments.plots import plot_run

    reqs = pd.DataFrame({"status": ["rejected"], "ttft_s": [float("nan")], "tpot_s": [float("nan")],
                         "e2e_s": [float("nan")]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_run(reqs, StepLog().frame(), tmp_path, "nothing ran")
    assert (tmp_path / "occupancy_batch.png").exists() and (tmp_path / "latency_cdf.png").exists()


def test_a_scenario_with_a_byte_order_mark_runs(tmp_path):
    """catches: a UTF-8 byte order mark (as some editors save) was refused as 'not valid TOML (line 1, column 1)'
    while trace CSVs with one were read."""
    path = tmp_path / "s.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b"[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 4\nrate = 5.0\n")
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 0


def test_compare_runs_each_policy(tmp_path, capsys):
    path = _write(tmp_path, "[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 15\nrate = 5.0\n"
                            "max_output_len = 8\n")
    """Each policy runs the same 15 requests to completion, and every cell of the printed table is its own
    policy's summary.json value (to the digits shown), as is compare.json. Planted bug: the table printing the
    first policy's numbers on every row (``s[k]`` -> ``first[k]`` in compare.summary_table) fails here (the three
    policies' TPOT differ in the 4th decimal)."""
    policies = ("granikv", "token", "paged16")
    assert main(["compare", path, "--policies", ",".join(policies), "--out", str(tmp_path / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    columns = {"req/s": "throughput_rps", "out tok/s": "output_tok_s", "TTFT p50": "ttft_p50_s",
               "TTFT p99": "ttft_p99_s", "TPOT p50": "tpot_p50_s", "TPOT p99": "tpot_p99_s", "done": "completed",
               "rej": "rejected", "preempt": "preemptions", "batch": "mean_batch", "hit": "prefix_hit_rate"}
    head = lines.index(next(line for line in lines if line.startswith("policy")))
    names = [lines[head][10 + 11 * i: 21 + 11 * i].strip() for i in range(len(columns))]
    assert names == list(columns)
    rows = {line[:10].strip(): line for line in lines[head + 2: head + 2 + len(policies)]}
    assert list(rows) == list(policies)
    compared = json.loads((tmp_path / "c" / "compare.json").read_text())
    first = None
    for pol, line in rows.items():
        summary = json.loads((tmp_path / "c" / pol / "summary.json").read_text())
        assert compared[pol] == summary
        assert summary["policy"] == pol and summary["requests"] == 15
        assert summary["completed"] == 15 and summary["rejected"] == 0
        first = first or summary
        for i, (name, key) in enumerate(columns.items()):
            cell = line[10 + 11 * i: 21 + 11 * i].strip()
            digits = len(cell.split(".")[1]) if "." in cell else 0
            assert float(cell) == pytest.approx(summary[key], abs=0.5 * 10 ** -digits + 1e-12), (pol, name, cell)
        ratio = line[10 + 11 * len(columns):].strip()
        assert ratio.endswith("x")
        assert float(ratio[:-1]) == pytest.approx(summary["throughput_rps"] / first["throughput_rps"], abs=0.005)


def test_fuzz_command_passes_on_a_real_policy(capsys):
    assert main(["fuzz", "--allocator", "token", "--examples", "20", "--seed", "1"]) == 0


def test_fuzz_leaves_nothing_in_the_current_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "granisim.cli", "fuzz", "--allocator", "token", "--examples", "5",
                           "--seed", "1"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []  # no .hypothesis/ (hypothesis' cache of the code's constants)


def test_console_script_reports_errors_without_traceback(tmp_path):
    path = _write(tmp_path, "[workload]\nrate = 0\n")
    proc = subprocess.run([sys.executable, "-m", "granisim.cli", "run", path], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "workload.rate" in proc.stderr


def test_fuzz_command_exits_1_with_the_shrunk_sequence(monkeypatch, capsys, tmp_path):
    import granisim.experiments.fuzz
    from tests.granisim.planted_bugs import PLANTED

    import hypothesis.internal.conjecture.engine as engine

    monkeypatch.setattr(granisim.experiments.fuzz, "default_factory", lambda policy: PLANTED["evicts_locked_node"])
    # hypothesis keeps shrinking for up to 500 successful shrinks (or 300 s); the sequence after 25 is what this
    # test reads: a count, not a clock, so the run is the same on any machine
    monkeypatch.setattr(engine, "MAX_SHRINKS", 25)
    monkeypatch.chdir(tmp_path)  # its repro goes to out/fuzz/ of the current folder: not the checkout's
    assert main(["fuzz", "--allocator", "token", "--examples", "300", "--seed", "3"]) == 1
    assert (tmp_path / "out" / "fuzz" / "repro_token.py").is_file()
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "FUZZ FAILURE" in text
    assert "state = AllocatorMachine()" in text  # hypothesis' reproducible rule sequence


def test_capacity_and_sensitivity_json_write_figures_with_no_value_as_null(tmp_path):
    """A probe whose requests were all rejected has no TTFT, and one-token outputs have no TPOT: capacity.json,
    fleet_capacity.json and sensitivity.json write such figures (and changes against them) as null, as
    summary.json does. Planted bug: their bare json.dumps wrote NaN, which strict readers refuse."""
    full = "[hardware]\nkv_budget_tokens = 1500\n[policy]\nhot_fraction = 0.5\n" \
           "[workload]\nprefix_len = 1024\nnum_requests = 6\nrate = 2.0\n"  # the COLD pool holds no request
    path = _write(tmp_path, full)
    out = tmp_path / "cap"
    assert main(["capacity", path, "--slo", "ttft_p99=1s", "--policies", "granikv", "--max-probes", "2",
                 "--out", str(out), "--sensitivity"]) == 0
    probes = _strict((out / "capacity.json").read_text())["results"][0]["probes"]
    assert probes and all(p["ttft_p99_s"] is None for p in probes)
    _strict((out / "capacity_sensitivity.json").read_text())
    (tmp_path / "f").mkdir()
    fleet = _write(tmp_path / "f", full + "[fleet]\nreplicas = 1\n")
    assert main(["capacity", fleet, "--slo", "ttft_p99=1s", "--rate", "2", "--max-replicas", "1",
                 "--policies", "granikv", "--workers", "1", "--out", str(tmp_path / "fc")]) == 0
    (res,) = _strict((tmp_path / "fc" / "fleet_capacity.json").read_text())["results"]
    assert res["probes"][0]["ttft_p99_s"] is None
    (tmp_path / "s").mkdir()
    one = _write(tmp_path / "s", "[workload]\nprefix_len = 512\nnum_requests = 6\nrate = 2.0\nmax_output_len = 1\n")
    assert main(["run", one, "--out", str(tmp_path / "s" / "out"), "--sensitivity"]) == 0
    rows = {r["metric"]: r for r in _strict((tmp_path / "s" / "out" / "sensitivity.json").read_text())["rows"]}
    assert rows["tpot_p99_s"]["predicted"] is None
    assert all(a == {"value": None, "change": None} for a in rows["tpot_p99_s"]["at"].values())
