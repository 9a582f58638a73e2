"""`granisim validation judge`: a candidate profile's reports over several runs, summed and compared."""
import json

import pytest

import granisim.validation.judge as J
from granisim.cli import main


def _rec(machine, workload, metric, met):
    return {"machine": machine, "model": "llama-3.1-8b", "workload": workload, "policy": "token", "metric": metric,
            "target": 0.05, "met": met}


def test_compare_counts_only_the_runs_both_judged():
    """A run passes when every check passes; a run only one side judged is left out of both counts."""
    cand = [_rec("runA1", "w1", "tpot", True), _rec("runA1", "w1", "ttft", True), _rec("runA1", "w2", "tpot", False),
            _rec("runB1", "w1", "tpot", True)]
    other = [_rec("runA1", "w1", "tpot", True), _rec("runA1", "w1", "ttft", False), _rec("runA1", "w2", "tpot", True)]
    c = J.compare(cand, other)
    assert c["runs"] == 2
    assert c["candidate"] == {"runs_met": 1, "checks_met": 2, "checks": 3}
    assert c["against"] == {"runs_met": 1, "checks_met": 2, "checks": 3}
    assert c["gained"] == [["runA1", "llama-3.1-8b", "w1", "token"]] and c["lost"] == [["runA1", "llama-3.1-8b", "w2", "token"]]
    assert "Runs the candidate passes and the other fails: 1:" in J.compare_table(c, "cand", "other")


def _fake_report(job):
    """What `granisim validation report` writes, reduced to what the summary reads: one workload whose TPOT p50
    error is 0.01 under token and 0.2 otherwise."""
    run, policy, model, out, profile = job
    err = 0.01 if policy == "token" else 0.2
    wl = {f"control_short_{policy}_{model}": {"check_profile": {
        "profile": profile, "step_errors": {"total": {"median": 0.01}},
        "end_to_end": {"tpot_p50_s": {"measured": 1.0, "predicted": 1.0 + err, "error": err}}}}}
    from pathlib import Path
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "h200.json").write_text(json.dumps({"run": {"dir": run}, "workloads": wl}))
    return ""


def test_judge_writes_one_report_per_policy_and_model_and_resumes(tmp_path, monkeypatch, capsys):
    """Two runs, two policies and two models in one: four reports, named run/policy-model; the summary counts
    them; a second call writes none (resumed). Planted bug caught: keying the report folder by policy alone (the
    second model's report overwrites the first's)."""
    for run, units in (("runA1", ["control_short_token_llama-3.1-8b", "control_short_granikv_llama-3.1-8b",
                                  "control_short_token_qwen-2.5-14b"]),
                       ("runB1", ["control_short_token_qwen-2.5-14b"])):
        (tmp_path / run / "h200_run").mkdir(parents=True)
        for u in units:
            (tmp_path / run / "h200_run" / f"validation_{u}.json").write_text("{}")
    calls = []
    monkeypatch.setattr(J, "_report", lambda job: calls.append(job) or _fake_report(job))
    out = tmp_path / "judged"
    args = ["validation", "judge", "h200-engine", str(tmp_path / "runA1"), str(tmp_path / "runB1"), "--out", str(out)]
    assert main(args) == 0
    assert sorted(p.relative_to(out).parent.as_posix() for p in out.glob("*/*/h200.json")) == [
        "runA1/granikv-llama-3.1-8b", "runA1/token-llama-3.1-8b", "runA1/token-qwen-2.5-14b",
        "runB1/token-qwen-2.5-14b"]
    assert "3 of 4 workload-policy-model runs meet every target" in (out / "summary.md").read_text()
    calls.clear()
    assert main(args) == 0 and calls == []


@pytest.mark.parametrize("args, needle", [(["nope"], "profile 'nope'"), (["h200-engine", "--jobs", "0"], "--jobs 0"),
                                          (["h200-engine", "--against", "missing.json"], "missing.json: not a")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, needle):
    run = tmp_path / "runA1"
    run.mkdir()
    (run / "validation_control_short_token_llama-3.1-8b.json").write_text("{}")
    assert main(["validation", "judge", args[0], str(run), "--out", str(tmp_path / "o"), *args[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
