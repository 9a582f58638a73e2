"""Bad command-line numbers: one line naming the option and the value, exit 2 (before any work starts)."""
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
