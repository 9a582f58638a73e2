"""granisim validation sensitivity: each validation workload's predictions with every step -+ delta."""
import pytest

from granisim.validation import sensitivity as vs


def test_a_saturated_workload_moves_its_throughput_with_the_steps():
    """multi_agent_16k on Qwen-2.5-14B under token runs a queue: its throughput follows step time almost 1:1."""
    s = vs.unit_sensitivity("multi_agent_16k", "token", "qwen-2.5-14b", "h200-engine", 0.03)
    faster, slower = s["throughput_rps"]
    assert 0.02 < faster < 0.04 and -0.04 < slower < -0.02
    assert set(s) == set(vs.METRICS)


def test_the_table_has_a_row_per_unit():
    row = {"model": "m", "workload": "w", "policy": "p", **{m: (-0.1, 0.2) for m in vs.METRICS}}
    text = vs.format_table([row], 0.03, "h200-engine")
    assert "| m | w | p | -10.0% / +20.0% |" in text and "x 0.97 / x 1.03" in text


@pytest.mark.parametrize("argv", [["--delta", "0.6"], ["--policies", "vllm", "--only", "control_short",
                                                       "--models", "llama-3.1-8b"]])
def test_bad_input_is_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        vs.main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("granisim validation sensitivity: error:")
