"""The candidate power/clock term of `granisim validation clock-term`."""
import numpy as np
import pytest

from granisim.cli import main
from granisim.validation.clock_term import heated


def test_heat_builds_over_hot_steps_and_decays_over_cool_ones():
    """A long run of compute-bound steps approaches the sustained slowdown; cool steps are priced as they are
    and let the heat decay, so a hot step after them costs less than one straight after hot steps. Planted
    bug: a heat state that never decays (no exp(-d / tau) on cool steps) fails the last check."""
    kw = dict(tau=0.1, hot_tokens=512, a_linear=0.2, a_attn=0.1)
    n = 50
    hot = heated(np.full(n, 4096), np.full(n, 0.1), np.full(n, 0.02), np.full(n, 0.01), **kw)
    assert hot[-1] == pytest.approx(0.01 + 0.1 * 1.2 + 0.02 * 1.1, rel=1e-6)
    assert np.all(np.diff(hot) >= 0) and hot[0] < hot[-1]
    tokens = np.array([4096] * 20 + [8] * 30 + [4096])
    lin = np.array([0.1] * 20 + [0.01] * 30 + [0.1])
    d = heated(tokens, lin, np.zeros(51), np.full(51, 0.001), **kw)
    assert np.allclose(d[20:50], 0.011)
    assert d[50] < d[19]


def test_missing_run_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["validation", "clock-term", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nope'}: no such run folder"
