"""`granisim validation host-probe`: CPU time a plan of the simulator's loop on a fixed workload."""
import pytest

from granisim.cli import main
from granisim.validation.host_probe import PROBE_REQUESTS, probe


def test_the_probe_serves_the_same_plans_every_run_and_times_them():
    """Two runs of the fixed workload: the same plan count (so the figure is per the same work on every machine),
    a positive CPU time each, and the median of them over the plans as the figure."""
    p = probe(repeats=2)
    assert p["plans"] > PROBE_REQUESTS // 2 and p["requests"] == PROBE_REQUESTS
    assert len(p["runs_s"]) == 2 and all(r > 0 for r in p["runs_s"])
    assert p["us_per_plan"] == pytest.approx(sum(p["runs_s"]) / 2 / p["plans"] * 1e6, rel=1e-3)


def test_bad_repeats_is_one_line_and_exit_2(capsys):
    assert main(["validation", "host-probe", "--repeats", "0"]) == 2
    assert "--repeats 0: give 1 or more" in capsys.readouterr().err
