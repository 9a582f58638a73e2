"""granisim validation fleet-summary: fleet-wide and per-replica records of fleet validation runs."""
import json
from pathlib import Path

import pandas as pd
import pytest

from granisim.validation import fleet_summary as F


def _section(err) -> dict:
    """Every end-to-end error ``err`` and the per-step median as well, or (end-to-end, per-step) errors."""
    if err is None:  # a replica that served nothing
        return {"step_errors": {"total": {"n": 0}}, "end_to_end": {}, "percentile_errors": {}}
    err, step = err if isinstance(err, tuple) else (err, err)
    e2e = {k: {"measured": 1.0, "predicted": 1.0 + err, "error": abs(err)}
           for k in ("throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")}
    return {"step_errors": {"total": {"n": 10, "median": abs(step), "p90": abs(step)}}, "end_to_end": e2e,
            "percentile_errors": {}}


@pytest.fixture(autouse=True)
def _routed(monkeypatch):
    """The re-run on the measured routing, stubbed: every section as the run's own, but the errors of the
    folder's ``routed.json`` where it has one (the fleet-summary bookkeeping is under test, not the re-run:
    tests/granisim/fleet/test_measured_routing.py runs it)."""
    def routed(scenario, source, measured):
        folder = Path(source).parent
        rep = json.loads((folder / "validation.json").read_text())
        alt = json.loads((folder / "routed.json").read_text()) if (folder / "routed.json").exists() else {}
        secs = [{"replica": r["replica"], **(_section(alt[str(r["replica"])]) if str(r["replica"]) in alt else r)}
                for r in rep["replicas"] if r["end_to_end"]]
        return {"same_replica": 1.0, "fleet": rep, "replicas": secs}
    monkeypatch.setattr(F, "on_measured_routing", routed)


def _run(folder, fleet_err, replica_errs, measured, predicted, routed=None):
    """A fleet validation run folder: errors fleet-wide and per replica; (rid, replica) of each side; ``routed``:
    replica -> error on the measured routing."""
    folder.mkdir(parents=True)
    (folder / "scenario.toml").write_text('name = "x"\n[fleet]\nreplicas = 2\n')
    if routed:
        (folder / "routed.json").write_text(json.dumps({str(k): v for k, v in routed.items()}))
    rep = {"scenario": folder.name, "router": "cache_aware", "policy": "granikv", "model": "llama-3.1-8b",
           "profile": "h200-engine", "num_replicas": len(replica_errs), **_section(fleet_err),
           "replicas": [{"replica": i, **_section(e)} for i, e in enumerate(replica_errs)]}
    (folder / "validation.json").write_text(json.dumps(rep))
    for side, pairs in (("measured", measured), ("predicted", predicted)):
        pd.DataFrame(pairs, columns=["rid", "replica"]).to_parquet(folder / f"{side}_requests.parquet")
    return folder


def test_records_per_scope_and_the_routing_agreement(tmp_path):
    """Records fleet-wide and for each replica that served (one that served nothing has none), the machine from
    the parent folder, and the share of requests on the same replica matched by request id, not by row (the
    predicted rows come in another order). Planted bug: comparing the two replica columns row by row gives 0.5."""
    a = _run(tmp_path / "machineX" / "a", 0.01, [0.02, 0.08, None],
             measured=[(0, 0), (1, 1), (2, 0), (3, 1)], predicted=[(3, 1), (2, 1), (1, 1), (0, 0)])
    recs = F.records([a])
    assert {r["machine"] for r in recs} == {"machineX"}
    assert {(r["routing"], r["scope"], r["replica"]) for r in recs} == {
        (g, s, i) for g in ("own", "measured") for s, i in (("fleet", None), ("replica", 0), ("replica", 1))}
    assert all(r["same_replica"] == 0.75 for r in recs)
    tput = {r["replica"]: r["met"] for r in recs if r["metric"] == "throughput_rps" and r["routing"] == "own"}
    assert tput == {None: True, 0: True, 1: False}  # the 5% target


def test_the_table_counts_runs_and_replicas_that_meet_every_target(tmp_path):
    """Per run: the replicas meeting every target under the own routing and on the measured one (there the
    per-step median is still the run's own). Planted: counting the measured routing's replicas from the own
    routing's records fails the 'bad' row."""
    ok = _run(tmp_path / "m" / "ok", 0.01, [0.01, 0.01], [(0, 0), (1, 1)], [(0, 0), (1, 1)])
    bad = _run(tmp_path / "m" / "bad", 0.06, [0.01, (0.2, 0.01)], [(0, 0), (1, 1)], [(0, 1), (1, 1)],
               routed={1: 0.02})
    text = F.table(F.records([ok, bad]))
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| m |")}
    assert rows["ok"].endswith("| 100% | 2 of 2 | 2 of 2 |") and "**" not in rows["ok"]
    assert rows["bad"].endswith("| 50% | 1 of 2 | 2 of 2 |") and "**+6.0%**" in rows["bad"]
    assert "1 of 2 runs meet every target; 6 of 10 target checks are met" in text


def test_bad_input_names_the_file(tmp_path, capsys):
    d = tmp_path / "m" / "single"
    d.mkdir(parents=True)
    (d / "validation.json").write_text(json.dumps({"end_to_end": {}, "step_errors": {}}))
    with pytest.raises(SystemExit) as e:
        F.main([str(d), "--out", str(tmp_path / "s.json")])
    assert e.value.code == 2 and f"{d / 'validation.json'}: replicas: not a fleet validation" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        F.main([str(tmp_path / "none"), "--out", str(tmp_path / "s.json")])
    assert e.value.code == 2 and "not a readable validation JSON" in capsys.readouterr().err
    ok = _run(tmp_path / "m" / "noreq", 0.01, [0.01], [(0, 0)], [(0, 0)])
    (ok / "predicted_requests.parquet").unlink()
    with pytest.raises(SystemExit) as e:
        F.main([str(ok), "--out", str(tmp_path / "s.json")])
    assert e.value.code == 2 and "predicted_requests.parquet: no requests with their replica" in capsys.readouterr().err


@pytest.mark.parametrize("edit, needle", [
    (lambda rep: rep["replicas"][0].pop("step_errors"), "field 'step_errors' missing"),
    (lambda rep: rep.update(step_errors={}), "field 'total' missing"),
    (lambda rep: rep["end_to_end"]["throughput_rps"].update(measured="fast"), "measured = 'fast': not a number"),
    (lambda rep: rep.update(replicas=[]), "replicas: not a fleet validation"),
])
def test_a_hand_edited_report_names_the_file(tmp_path, capsys, edit, needle):
    """catches: each was a KeyError or TypeError traceback (exit 1), or for no replicas '0 of 0' (exit 0)."""
    d = _run(tmp_path / "m" / "a", 0.01, [0.01, 0.01], [(0, 0), (1, 1)], [(0, 0), (1, 1)])
    rep = json.loads((d / "validation.json").read_text())
    edit(rep)
    (d / "validation.json").write_text(json.dumps(rep))
    with pytest.raises(SystemExit) as e:
        F.main([str(d), "--out", str(tmp_path / "s.json")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(f"error: {d / 'validation.json'}: ") and needle in err, err
    assert len(err.splitlines()) == 1


def test_a_run_given_twice_is_refused_and_a_measured_zero_shows_a_dash(tmp_path, capsys):
    """catches: the same folder twice doubled the JSON's records and AND-ed the two into one table row; a measured
    figure of 0 raised ZeroDivisionError in the table."""
    d = _run(tmp_path / "m" / "a", 0.01, [0.01, 0.01], [(0, 0), (1, 1)], [(0, 0), (1, 1)])
    with pytest.raises(SystemExit) as e:
        F.main([str(d), str(d), "--out", str(tmp_path / "s.json")])
    assert e.value.code == 2 and "give each run once" in capsys.readouterr().err
    recs = F.records([d])
    for r in recs:
        if r["metric"] == "ttft_p99_s":
            r["measured"] = 0.0
    assert "| - |" in F.table(recs)
