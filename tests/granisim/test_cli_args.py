"""Bad command-line numbers and --out paths: one line naming the option and the value, exit 2 (before any work
starts)."""
from pathlib import Path

import pytest

from granisim.cli import main

CASES = [
    (["sweep", "sweeps/msat.toml", "--workers", "0"], "--workers", "0"),
    (["sweep", "sweeps/msat.toml", "--workers", "-2"], "--workers", "-2"),
    (["capacity", "scenarios/multi_agent_16k.toml", "--slo", "ttft_p99=2s", "--rel-tol", "-1"], "--rel-tol", "-1"),
    (["capacity", "scenarios/multi_agent_16k.toml", "--slo", "ttft_p99=2s", "--rel-tol", "1"], "--rel-tol", "1"),
    (["capacity", "scenarios/multi_agent_16k.toml", "--slo", "ttft_p99=2s", "--max-probes", "0"], "--max-probes", "0"),
    (["capacity", "scenarios/multi_agent_16k.toml", "--slo", "ttft_p99=2s", "--lo", "nan"], "--lo", "nan"),
    (["capacity", "scenarios/multi_agent_16k.toml", "--slo", "ttft_p99=2s", "--hi", "inf"], "--hi", "inf"),
    (["paper", "--num-requests", "zero"], "--num-requests", "zero"),
    (["fuzz", "--examples", "0"], "--examples", "0"),
    (["fuzz", "--seed", "-1"], "--seed", "-1"),  # hypothesis' Random ignores the sign: it would repeat --seed 1
    (["calibrate", "fit", "calibration/raw/h200", "--out", "/tmp/x.json", "--folds", "0"], "--folds", "0"),
    # each fold is a whole fit: 100000 of them ran for days before the bound
    (["calibrate", "fit", "calibration/raw/h200", "--out", "/tmp/x.json", "--folds", "100000"], "--folds", "< 21"),
]


@pytest.mark.parametrize("argv,option,value", CASES)
def test_bad_numbers_are_one_line_exit_2(argv, option, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0] and value in err[0], err


def test_capacity_of_a_trace_replay_is_one_line_exit_2(capsys):
    """catches: bisecting workload.rate on a replay, whose arrivals come from the trace (the rate has no effect)."""
    assert main(["capacity", "scenarios/azure_replay.toml", "--slo", "ttft_p99=2s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "azure_replay.toml" in err[0] and "workload.arrivals" in err[0], err


@pytest.mark.parametrize("argv, option", [
    (["compare", "--routers", ""], "--routers"),  # was: a comparison of the default policies instead
    (["capacity", "--slo", "ttft_p99=2s", "--policies", ""], "--policies"),  # was: granikv,token,paged16
    (["capacity", "--slo", "ttft_p99=2s", "--rate", "2", "--routers", ""], "--routers"),  # was: the scenario's
    (["capacity", "--slo", "ttft_p99=2s", "--rate", "2", "--policies", ""], "--policies"),  # was: the scenario's
])
def test_an_empty_name_list_is_refused_not_replaced_by_the_default(argv, option, tmp_path, capsys):
    """catches: `--routers ''` or `--policies ''` was read as not given (an empty string is falsy), and the command
    ran its default silently."""
    sc = tmp_path / "f.toml"
    sc.write_text('name = "f"\n[workload]\nroles = 2\nprefix_len = 256\nnum_requests = 4\n[fleet]\nreplicas = 2\n')
    out = tmp_path / "o"
    assert main([argv[0], str(sc), *argv[1:], "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {option}: give at least one name, e.g. "), err
    assert not out.exists()


@pytest.mark.parametrize("argv, option, value", [
    (["compare", "S", "--policies", "granikv,"], "--policies", "'granikv,'"),  # was: granikv alone, silently
    (["compare", "S", "--routers", "round_robin,,cache_aware"], "--routers", "'round_robin,,cache_aware'"),
    (["capacity", "S", "--slo", "ttft_p99=2s", "--policies", ",token"], "--policies", "',token'"),
    (["capacity", "S", "--slo", "ttft_p99=2s", "--rate", "2", "--routers", "cache_aware, "], "--routers",
     "'cache_aware, '"),
    (["paper", "--profiles", "h200,"], "--profiles", "'h200,'"),
])
def test_an_empty_name_in_a_name_list_is_refused_not_dropped(argv, option, value, tmp_path, capsys):
    """catches: `--policies granikv,` ran granikv alone: the empty name after the comma (most likely a typo, a name
    left out) was dropped without a word."""
    sc = tmp_path / "f.toml"
    sc.write_text('name = "f"\n[workload]\nroles = 2\nprefix_len = 256\nnum_requests = 4\n[fleet]\nreplicas = 2\n')
    out = tmp_path / "o"
    assert main([str(sc) if a == "S" else a for a in argv] + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {option} {value}: an empty name (a stray comma)"), err
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["run", "scenarios/multi_agent_16k.toml"],
    ["compare", "scenarios/multi_agent_16k.toml"],
    ["compare", "scenarios/fleet_16roles.toml", "--routers", "round_robin"],
    ["demo"],
    ["sweep", "sweeps/msat.toml"],
    ["capacity", "scenarios/multi_agent_16k.toml", "--slo", "ttft_p99=2s"],
    ["capacity", "scenarios/fleet_16roles.toml", "--slo", "ttft_p99=2s", "--rate", "20"],
    ["paper"],
])
def test_an_out_folder_that_is_a_file_is_refused_before_anything_runs(argv, tmp_path, capsys, monkeypatch):
    """`--out` naming an existing file: one line naming it, exit 2, before anything runs (not a FileExistsError
    traceback). catches: `compare --out FILE` simulated the first policy, then failed on the folder ('Not a
    directory'); `run --out FILE` failed when writing ('File exists')."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    out = tmp_path / "a_file"
    out.write_text("mine")
    argv = [a if not a.endswith(".toml") else str(root / a) for a in argv]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --out {out}: a file is there; give a folder to write into"], err
    assert out.read_text() == "mine"


@pytest.mark.parametrize("argv", [
    ["run", "scenarios/multi_agent_16k.toml"],
    ["compare", "scenarios/multi_agent_16k.toml"],
    ["capacity", "scenarios/fleet_16roles.toml", "--slo", "ttft_p99=2s", "--rate", "20"],
    ["paper"],
])
def test_an_out_folder_under_a_file_is_refused_before_anything_runs(argv, tmp_path, capsys, monkeypatch):
    """catches: `run --out FILE/sub` simulated the whole scenario, then failed writing its outputs ('Not a
    directory', without --out)."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    (tmp_path / "a_file").write_text("mine")
    out = tmp_path / "a_file" / "sub"
    argv = [a if not a.endswith(".toml") else str(root / a) for a in argv]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --out {out}: {tmp_path / 'a_file'} is a file, not a folder"], err


@pytest.mark.parametrize("where", ["folder", "under a file"])
def test_a_fuzz_repro_that_cannot_be_written_is_refused_before_fuzzing(where, tmp_path, capsys, monkeypatch):
    """catches: `fuzz --repro DIR` (or a path under a file) fuzzed first and failed only when a failure's
    reproduction was written, an IsADirectoryError after the shrinking, the reproduction lost (exit 2 in place of
    1); with no failure found it was never noticed."""
    from hypothesis import stateful

    from tests.granisim.cli_errors import one_line_error

    monkeypatch.setattr(stateful, "run_state_machine_as_test", lambda *a, **k: pytest.fail("fuzzed"))
    (tmp_path / "f").write_text("mine")
    repro = tmp_path if where == "folder" else tmp_path / "f" / "repro.py"
    rc = main(["fuzz", "--allocator", "token", "--examples", "5", "--repro", str(repro)])
    one_line_error(capsys, rc, f"--repro {repro}", "a folder" if where == "folder" else f"{tmp_path / 'f'} is a file")
