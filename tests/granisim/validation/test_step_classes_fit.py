"""`granisim validation step-classes`: factors are sums' ratios per model, policy and class; held-out workloads and
the base profile's own factors stay out of the fit; the profile written loads."""
import json
from dataclasses import replace

import pandas as pd
import pytest

import granisim.validation.step_classes as SC
from granisim.cli import main
from granisim.config.coefficients import Source, StepClasses
from granisim.config.hardware import get_profile
from granisim.core.contract import BatchPlan, PlannedRequest


def test_a_factor_is_the_ratio_of_sums_and_needs_its_steps():
    sums = {("llama-3.1-8b", "token", "decode 1-4"): [3.0, 2.0, 25],  # 1 s and 2 s priced 1 s each: 1.5, not 1.25
            ("llama-3.1-8b", "token", "decode 5-16"): [9.0, 3.0, 19],  # too few steps: no factor
            ("qwen-2.5-14b", "paged16", "prefill <=8191 x2 fresh"): [2.2, 2.0, 20]}
    assert SC.factors(sums, min_steps=20) == {"llama-3.1-8b": {"token": {"decode 1-4": 1.5}},
                                "qwen-2.5-14b": {"paged16": {"prefill <=8191 x2 fresh": 1.1}}}
    assert SC.factors(sums)["llama-3.1-8b"]["token"]["decode 5-16"] == 3.0  # the default takes every class


def _unit(name, n_steps, measured):
    plans = [BatchPlan(i, "token", 1, (PlannedRequest(0, 100 + i, 1, False),)) for i in range(n_steps)]
    return name, pd.DataFrame({"measured_s": [measured] * n_steps, "batch": 1, "tokens": 1}), plans


def test_sums_leave_held_out_workloads_and_the_base_factors_out(monkeypatch):
    """Planted bugs caught: summing the held-out workload's steps (its 10 s steps would show), or pricing with the
    base's own factors (a base factor of 2 would halve the fitted one)."""
    units = [_unit("runA1/control_short_token_llama-3.1-8b", 30, 0.004),
             _unit("runA1/arxiv_replay_500_token_llama-3.1-8b", 30, 10.0)]
    monkeypatch.setattr(SC, "run_units", lambda run: [(n, s, p, "llama-3.1-8b") for n, s, p in units])
    base = get_profile("h200-engine")
    doubled = replace(base, step_classes=StepClasses({"llama-3.1-8b": {"token": {"decode 1-4": 2.0}}},
                                                     Source("measured", date="d", command="c")))
    for prof in (base, doubled):
        sums, names = SC.class_sums(["runA1"], prof)
        assert names == ["runA1/control_short_token_llama-3.1-8b"]
        (key, (measured, priced, n)), = sums.items()
        assert key == ("llama-3.1-8b", "token", "decode 1-4") and n == 30 and measured == pytest.approx(0.12)
        assert 0.5 < measured / priced < 2  # a decode step of one request priced about as the engine runs it


def test_the_command_writes_a_profile_that_loads(tmp_path, monkeypatch, capsys):
    units = [_unit("runA1/control_short_token_llama-3.1-8b", 30, 0.004)]
    monkeypatch.setattr(SC, "run_units", lambda run: [(n, s, p, "llama-3.1-8b") for n, s, p in units])
    (tmp_path / "runA1").mkdir()
    out = tmp_path / "fitted.json"
    assert main(["validation", "step-classes", str(tmp_path / "runA1"), "--out", str(out)]) == 0
    prof = get_profile(str(out))
    assert prof.name == "fitted" and set(prof.step_classes.for_model("llama-3.1-8b")["token"]) == {"decode 1-4"}
    assert prof.step_classes.source.kind == "measured"
    # written as made from h200-engine: its coefficients are the base's, the file holds the factors
    assert json.loads(out.read_text())["base"]["profile"] == "h200-engine"
    assert dict(prof.coefficients) == dict(get_profile("h200-engine").coefficients)
    assert "| llama-3.1-8b | token | decode 1-4 | 30 |" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["NOPE", "--out", "p.json"], "NOPE: no such run folder"),
    (["RUN", "--out", "p.txt"], "--out p.txt: a profile is a .json file"),
    (["RUN", "--out", "p.json", "--min-steps", "0"], "--min-steps 0: give 1 or more"),
    (["RUN", "--out", "p.json", "--except", "RUN"], "leaves none of the runs to fit on"),
    # catches: a mistyped run was ignored, turning a held-out fit into an in-sample one (exit 0)
    (["RUN", "--out", "p.json", "--except", "NOPE"], "--except NOPE: not one of the runs given"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "RUN").mkdir()
    assert main(["validation", "step-classes", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err


def test_a_malformed_validation_json_is_named(tmp_path, capsys):
    """catches: `validation refit` printed json's own message ('Expecting property name ...') without the file."""
    bad = tmp_path / "RUN" / "validation_multi_agent_16k_granikv_llama-3.1-8b.json"
    bad.parent.mkdir()
    bad.write_text("{")
    assert main(["validation", "refit", str(bad.parent), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "not a readable JSON file" in err, err
