"""`granisim validation summary`: bad input is one line and exit 2; the MAPE is the mean error per group."""
import json

import pytest

from granisim.validation import summary as S


def _rep(err: float) -> dict:
    return {"step_errors": {"total": {"median": err / 2}},
            "end_to_end": {"tpot_p50_s": {"measured": 1.0, "predicted": 1.0 + err, "error": err}},
            "percentile_errors": {"e2e_p90": {"measured": 2.0, "predicted": 2.0, "error": 0.0}}, "idle": True}


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        S.main([str(tmp_path / "none"), "--out", str(tmp_path / "s.json")])
    assert e.value.code == 2 and "no such folder" in capsys.readouterr().err
    (tmp_path / "validation_azure_replay.json").write_text("{")
    with pytest.raises(SystemExit) as e:
        S.main([str(tmp_path), "--out", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "validation_azure_replay.json: not a readable validation JSON" in err
    assert len(err.strip().splitlines()) == 1


def test_a_figure_that_is_not_a_number_is_named(tmp_path, capsys):
    """catches: a measured value "fast" went into the record as it was, with met = true (exit 0)."""
    rep = _rep(0.01)
    rep["end_to_end"]["tpot_p50_s"]["measured"] = "fast"
    f = tmp_path / "validation_azure_replay_token_llama-3.1-8b.json"
    f.write_text(json.dumps(rep))
    with pytest.raises(SystemExit) as e:
        S.main([str(tmp_path), "--out", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and str(f) in err and "tpot_p50_s measured = 'fast': not a number" in err, err
    assert not (tmp_path / "s.json").exists()


def test_mape_is_the_mean_over_workloads_and_machines(tmp_path):
    """Over workloads and machines, and per workload over machines (BLIS's convention). Planted bug: the MAPE
    taken as the middle value (0.03) instead of the mean (0.05) fails."""
    for machine, w, err in (("m1", "azure_replay", 0.02), ("m2", "azure_replay", 0.10), ("m1", "control_short", 0.03)):
        d = tmp_path / machine / "h200_run"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"validation_{w}_token_llama-3.1-8b.json").write_text(json.dumps(_rep(err)))
    S.main([str(tmp_path), "--out", str(tmp_path / "s.json")])
    doc = json.loads((tmp_path / "s.json").read_text())
    assert len(doc["records"]) == 3 * 3
    (row,) = [m for m in doc["mape"] if m["metric"] == "tpot_p50_s"]
    assert (row["policy"], row["model"], row["n"]) == ("token", "llama-3.1-8b", 3)
    assert row["mape"] == pytest.approx(0.05)
    by_w = {m["workload"]: (m["n"], m["mape"]) for m in doc["mape_by_workload"] if m["metric"] == "tpot_p50_s"}
    assert by_w == {"azure_replay": (2, pytest.approx(0.06)), "control_short": (1, pytest.approx(0.03))}
    met = {(r["machine"], r["workload"]): r["met"] for r in doc["records"] if r["metric"] == "tpot_p50_s"}
    assert met == {("m1", "azure_replay"): True, ("m2", "azure_replay"): False, ("m1", "control_short"): True}


def test_reports_give_the_checked_profiles_predictions(tmp_path, capsys):
    """--reports takes the check_profile variant (a profile judged on a machine it was not fitted on), not the
    prediction made at run time; the machine comes from the report's run folder."""
    chk = {"profile": "granisim/config/profiles/h200-engine.json", **_rep(0.04)}
    at_run = {"step_errors": {"total": {"median": 0.5}}, "end_to_end": {}}
    rep = {"run": {"dir": "RAW/validation/runG1/h200_run", "date": "d"},
           "workloads": {"arxiv_replay_500_token_llama-3.1-8b": {"idle": True, "at_run_time": at_run,
                                                                "check_profile": chk}}}
    (tmp_path / "h200.json").write_text(json.dumps(rep))
    S.main(["--reports", str(tmp_path / "h200.json"), "--out", str(tmp_path / "s.json")])
    recs = json.loads((tmp_path / "s.json").read_text())["records"]
    assert {(r["machine"], r["workload"], r["policy"], r["variant"], r["held_out"]) for r in recs} == \
        {("runG1", "arxiv_replay_500", "token", "profile:h200-engine", True)}
    by = {r["metric"]: r for r in recs}
    assert by["step_median"]["error"] == pytest.approx(0.02) and by["tpot_p50_s"]["met"] is True
    assert "e2e_p90" in by
    with pytest.raises(SystemExit) as e:
        S.main([str(tmp_path), "--reports", str(tmp_path / "h200.json"), "--out", str(tmp_path / "s.json")])
    assert e.value.code == 2 and "not both" in capsys.readouterr().err


def test_the_table_gives_signed_errors_and_bolds_the_misses():
    base = {"workload": "azure_replay", "policy": "token", "model": "llama-3.1-8b", "machine": "runX",
            "held_out": False}
    recs = [S._record(base, "step_median", None, None, 0.02),
            S._record(base, "tpot_p50_s", 0.010, 0.0093, 0.07),  # 7% optimistic: a miss of the 5% target
            S._record(base, "ttft_p99_s", 0.5, 0.52, 0.04),
            S._record({**base, "policy": "granikv"}, "throughput_rps", 2.0, 2.01, 0.005)]
    text = S.signed_table(recs)
    token = next(line for line in text.splitlines() if "| token |" in line)
    assert "| 2.0% |" in token and "**-7.0%**" in token and "+4.0%" in token
    assert "1 of 2 workload-policy-model runs meet every target; 3 of 4 target checks are met." in text


def test_a_figure_measured_as_null_or_0_is_a_dash_in_the_table():
    """catches: a TypeError (null) or ZeroDivisionError (0) in `validation summary --table`."""
    base = {"workload": "azure_replay", "policy": "token", "model": "llama-3.1-8b", "machine": "runX",
            "held_out": False}
    recs = [S._record(base, "throughput_rps", None, 2.0, 0.01), S._record(base, "ttft_p99_s", 0.0, 0.5, 0.02)]
    row = next(line for line in S.signed_table(recs).splitlines() if "| token |" in line)
    assert "%" not in row.split("| token |")[1], row


def test_the_glance_table_counts_machines_whose_run_meets_every_target():
    """azure_replay under token on three machines: X meets every target, Y misses one of two checks, Z meets its
    one: "2 / 3". A policy no machine ran is '-'. Planted bug caught: a run counted as met when any of its checks
    is (Y would count: 3 / 3)."""
    def rec(machine, metric, err, policy="token", workload="azure_replay"):
        base = {"workload": workload, "policy": policy, "model": "llama-3.1-8b", "machine": machine,
                "held_out": False}
        return S._record(base, metric, 1.0, 1.0 + err, abs(err))

    recs = [rec("runX", "tpot_p50_s", 0.01), rec("runX", "ttft_p99_s", 0.02), rec("runY", "tpot_p50_s", 0.01),
            rec("runY", "ttft_p99_s", 0.2), rec("runZ", "tpot_p50_s", 0.0),
            rec("runX", "tpot_p50_s", 0.01, policy="granikv", workload="control_short")]
    lines = S.glance_table(recs).splitlines()
    assert lines[0] == "| model | workload | granikv | token |"
    assert "| llama-3.1-8b | control_short | 1 / 1 | - |" in lines
    assert "| llama-3.1-8b | azure_replay | - | 2 / 3 |" in lines
