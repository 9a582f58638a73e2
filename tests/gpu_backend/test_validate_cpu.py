"""`granisim validate` end to end on the CPU (tiny model, Triton interpreter): the pipeline
pairs every measured step with the cost model's price of the same plan and writes the report."""

import json

import numpy as np
import pandas as pd
import pytest

from granisim.cli import main
from granisim.config.scenario import load_scenario
from granisim.costmodel import BREAKDOWN_KEYS, step_cost
from granisim.experiments.run import prepare
from granisim.validation.plans import load_plans

from gb_util import validate_on_cpu


def test_validate_writes_a_report(tmp_path, capsys):
    """The report's per-step errors are those of the stored plans re-priced: each plan in plans.pkl matches its
    row of steps.parquet (step, batch, tokens), its cost-model price is the row's prediction, and the median
    and p90 of |predicted - measured| / measured, recomputed here, are the report's (total and per key).
    Planted bugs: the error taken relative to the prediction (``/ meas`` -> ``/ pred`` in validate._rel) fails
    the recomputed medians; the paired executor pricing another plan than the one it stores (the plan read as
    16-token pages, ``replace(plan, page_size=16)``) fails the re-priced predictions."""
    out, rep, steps = validate_on_cpu(tmp_path, 'name = "tiny"\n[model]\nname = "tiny"\n[hardware]\nkv_budget_tokens = 512\n'
                                      "[workload]\nroles = 1\nprefix_len = 24\nnum_requests = 3\nrate = 100.0\n"
                                      "suffix_scale = 0.01\nmax_output_len = 3\n")
    plans = load_plans(out / "plans.pkl")
    assert rep["steps"] == len(steps) == len(plans) >= 3
    assert (out / "validation.png").exists()
    assert "Per step" in capsys.readouterr().out

    sc = tmp_path / "scenario.toml"  # as validate_on_cpu wrote it
    setup = prepare(load_scenario(sc), str(sc))
    assert rep["profile"] == setup.profile.name and rep["model"] == setup.model.name
    assert any(p.groups for p in plans)  # the shared prefix ran grouped in some step
    for row, p in zip(steps.itertuples(), plans):
        assert (row.step, row.batch, row.tokens) == (p.step, len(p.requests), p.num_tokens)
        priced = step_cost(p, setup.profile, setup.model)
        assert row.predicted_s == pytest.approx(priced.duration_s, rel=1e-12)
        for k in BREAKDOWN_KEYS:
            assert getattr(row, f"predicted_{k}") == pytest.approx(priced.breakdown[k], rel=1e-12, abs=1e-15), k
    assert (steps.measured_s > 0).all()

    def errors(pred, meas):
        pred, meas = np.asarray(pred, float), np.asarray(meas, float)
        keep = meas > 0
        return abs(pred[keep] - meas[keep]) / meas[keep]

    want = {"total": errors(steps.predicted_s, steps.measured_s)}
    for k in BREAKDOWN_KEYS:
        if (steps[f"measured_{k}"] > 0).sum() >= 3:
            want[k] = errors(steps[f"predicted_{k}"], steps[f"measured_{k}"])
    assert set(rep["step_errors"]) == set(want)
    assert len(want) > 3  # per-key errors, not just the total
    for k, e in want.items():
        got = rep["step_errors"][k]
        assert got["n"] == e.size, k
        assert got["median"] == pytest.approx(float(np.median(e)), rel=1e-9), k
        assert got["p90"] == pytest.approx(float(np.percentile(e, 90)), rel=1e-9), k
    e2e = rep["end_to_end"]
    assert {"throughput_rps", "ttft_p99_s", "tpot_p50_s"} <= set(e2e)
    for k, v in e2e.items():
        assert v["error"] == pytest.approx(abs(v["predicted"] - v["measured"]) / v["measured"], rel=1e-12), k


TINY = ('name = "tiny"\n[model]\nname = "tiny"\n[hardware]\nkv_budget_tokens = 512\n[policy]\nname = "{policy}"\n'
        "[workload]\nroles = 1\nprefix_len = 24\nnum_requests = 4\nrate = 100.0\nsuffix_scale = 0.01\nmax_output_len = 3\n")


def _tiny_validation(tmp_path, policy: str, idle: bool = True):
    from gpu_backend.executor import for_setup
    from granisim.validation.validate import validate

    sc = tmp_path / f"tiny_{policy}.toml"
    sc.write_text(TINY.format(policy=policy))
    setup = prepare(load_scenario(sc), str(sc))
    out = tmp_path / f"val_{policy}"
    return validate(setup, for_setup(setup, "cpu"), out, progress=False, idle=idle), out


def test_latency_percentile_errors_recomputed_from_the_stored_frames(tmp_path):
    """The report's TTFT / TPOT / E2E errors at p50/p90/p99 (BLIS's convention) are, recomputed here from the
    stored measured and predicted request frames, numpy.percentile over completed requests and
    |predicted - measured| / measured. The report records that the run idled between arrivals.
    Planted bug: the predicted percentile taken over the measured frame (``p = m`` in percentile_errors)
    fails the predicted values."""
    rep, out = _tiny_validation(tmp_path, "granikv")
    mreq = pd.read_parquet(out / "measured_requests.parquet")
    sreq = pd.read_parquet(out / "predicted_requests.parquet")
    pe = rep["percentile_errors"]
    assert set(pe) == {f"{m}_p{q}" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)}
    for m in ("ttft", "tpot", "e2e"):
        meas = mreq.loc[mreq.status == "completed", f"{m}_s"].dropna().to_numpy(float)
        pred = sreq.loc[sreq.status == "completed", f"{m}_s"].dropna().to_numpy(float)
        assert meas.size >= 3 and pred.size >= 3
        for q in (50, 90, 99):
            want_m, want_p = np.percentile(meas, q), np.percentile(pred, q)
            got = pe[f"{m}_p{q}"]
            assert got["measured"] == pytest.approx(want_m, rel=1e-12)
            assert got["predicted"] == pytest.approx(want_p, rel=1e-12)
            assert got["error"] == pytest.approx(abs(want_p - want_m) / want_m, rel=1e-9)
    assert not np.allclose(mreq.ttft_s, sreq.ttft_s)  # measured and predicted differ: the check has teeth
    assert rep["idle"] is True and rep["idled_s"] >= 0
    md = (out / "validation.md").read_text()
    assert "Latency percentiles" in md and "Idle between arrivals: on" in md


def test_summary_has_one_record_per_combination(tmp_path, capsys):
    """`granisim validation summary` over two machines' run folders, two policies, one old-style (bare
    workload name) and new-style unit names: one record per workload x policy x model x machine x metric, and
    each record's numbers are the run JSON's. Planted bug: every record given one machine name (the runs'
    folders not told apart) fails the count."""
    import shutil

    from granisim.validation.gpu_runs import unit_name
    from granisim.validation.summary import records

    raw = tmp_path / "raw"
    reps = {}
    for pol in ("granikv", "token"):
        rep, out = _tiny_validation(tmp_path, pol, idle=False)
        reps[pol] = rep
        for machine in ("runX1", "runY1"):
            dest = raw / machine / "h200_run"
            dest.mkdir(parents=True, exist_ok=True)
            name = unit_name("control_short", pol, "llama-3.1-8b")
            (dest / f"validation_{name}.json").write_text(json.dumps(rep))
            shutil.copytree(out, dest / name)
    old = raw / "runZ1" / "h200_run"  # an earlier run: bare workload names, granikv on llama-3.1-8b
    old.mkdir(parents=True)
    (old / "validation_azure_replay.json").write_text(json.dumps(reps["granikv"]))
    target = tmp_path / "summary.json"
    assert main(["validation", "summary", str(raw), "--out", str(target)]) == 0
    doc = json.loads(target.read_text())
    recs = doc["records"]
    assert recs == records(raw)
    metrics = 1 + len(reps["granikv"]["end_to_end"]) + len(reps["granikv"]["percentile_errors"])
    keys = [(r["workload"], r["policy"], r["model"], r["machine"], r["variant"], r["metric"]) for r in recs]
    assert len(keys) == len(set(keys)) == metrics * (2 * 2 + 1)
    assert {(k[0], k[1], k[3]) for k in keys} == {("control_short", p, m) for p in ("granikv", "token")
                                                  for m in ("runX1", "runY1")} | {("azure_replay", "granikv", "runZ1")}
    for r in recs:
        rep = reps[r["policy"]]
        src = (rep["end_to_end"].get(r["metric"]) or rep["percentile_errors"].get(r["metric"])
               or {"error": rep["step_errors"]["total"]["median"], "measured": None, "predicted": None})
        assert (r["measured"], r["predicted"], r["error"]) == (src["measured"], src["predicted"], src["error"])
        if r["target"] is not None:
            assert r["met"] == (r["error"] <= r["target"])
        assert r["idle"] is False
    assert any(r["target"] is None for r in recs) and any(r["met"] is not None for r in recs)


def test_rescore_reproduces_the_report_and_follows_the_profile(tmp_path, capsys):
    """`granisim validation rescore` on a fresh run with the run's own profile gives back the report's per-step
    and end-to-end errors; with another profile the predictions move and the measured figures do not.
    Planted: rescore pricing with the scenario's profile whatever --profile says fails the second half."""
    from granisim.validation.rescore import rescore

    out, rep, _ = validate_on_cpu(tmp_path, 'name = "tiny"\n[model]\nname = "tiny"\n[hardware]\nkv_budget_tokens = 512\n'
                                  "[workload]\nroles = 1\nprefix_len = 24\nnum_requests = 3\nrate = 100.0\n"
                                  "suffix_scale = 0.01\nmax_output_len = 3\n")
    sc = tmp_path / "scenario.toml"
    same = rescore(out, sc)
    assert same["step_errors"] == rep["step_errors"]
    for k, e in rep["end_to_end"].items():
        assert same["end_to_end"][k]["predicted"] == pytest.approx(e["predicted"], rel=1e-12), k
    other = rescore(out, sc, "h200")
    assert other["profile"] == "h200" != rep["profile"]
    assert other["end_to_end"]["throughput_rps"]["measured"] == rep["end_to_end"]["throughput_rps"]["measured"]
    assert other["end_to_end"]["tpot_p50_s"]["predicted"] != pytest.approx(rep["end_to_end"]["tpot_p50_s"]["predicted"])
    assert main(["validation", "rescore", str(out), "--scenario", str(sc), "--out", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())[0]["step_errors"] == rep["step_errors"]
    assert main(["validation", "rescore", str(tmp_path)]) == 2  # no run there, no scenario beside it
    assert "no" in capsys.readouterr().err


def test_refit_pools_every_policy_of_the_runs_it_is_given(tmp_path, capsys):
    """`granisim validation refit` fits one profile on every policy's units of the runs left after --except,
    the held-out workload in none: its coefficients are engine_fit's over exactly those units re-priced, and
    the profile loads, the fit uses the runs' own CUDA-graph limit, and runs of different limits are refused.
    Planted bug: --except ignored (every run pooled) fails the unit list and the values."""
    import shutil

    from granisim.calibration.engine_fit import fit
    from granisim.config.hardware import get_profile
    from granisim.config.models import get_model
    from granisim.validation.clock_term import run_units
    from granisim.validation.gpu_runs import unit_name
    from granisim.validation.validate import reprice

    raw = tmp_path / "raw"
    for pol, seed_dir in (("granikv", "runX1"), ("token", "runX1"), ("granikv", "runY1")):
        (tmp_path / f"{seed_dir}_{pol}").mkdir()
        rep, out = _tiny_validation(tmp_path / f"{seed_dir}_{pol}", pol, idle=False)
        dest = raw / seed_dir / "h200_run"
        dest.mkdir(parents=True, exist_ok=True)
        for w in ("control_short", "arxiv_replay_500"):  # the second is held out of every fit
            name = unit_name(w, pol, "llama-3.1-8b")
            (dest / f"validation_{name}.json").write_text(json.dumps(rep))
            shutil.copytree(out, dest / name)
    prof = tmp_path / "fitted.json"
    assert main(["validation", "refit", str(raw / "runX1"), str(raw / "runY1"), "--except", str(raw / "runY1"),
                 "--out", str(prof)]) == 0
    assert "fitted on 2 units of 1 runs" in capsys.readouterr().out
    base = get_profile("h200")
    llama = get_model("llama-3.1-8b")
    frames = [reprice(s, p, base, llama) for u, s, p, m in run_units(raw / "runX1") if "arxiv" not in u]
    want = fit(frames, 0, llama.num_layers)  # the run's own graph limit: a CPU run replays no graphs
    got = get_profile(str(prof))
    assert {k: got.coefficients[k].value for k in want} == pytest.approx(want)
    assert got.coefficients["attn.decode.shared_reread"].value == get_profile("h200-engine").coefficients[
        "attn.decode.shared_reread"].value
    assert main(["validation", "refit", str(tmp_path / "nowhere"), "--out", str(prof)]) == 2
    for js in (raw / "runY1" / "h200_run").glob("validation_*.json"):  # runY1 as if replayed under graphs
        doc = json.loads(js.read_text())
        js.write_text(json.dumps({**doc, "executor": {**(doc.get("executor") or {}), "graph_max_rows": 2048}}))
    capsys.readouterr()
    assert main(["validation", "refit", str(raw / "runX1"), str(raw / "runY1"), "--out", str(prof)]) == 2
    assert "different CUDA-graph limits" in capsys.readouterr().err

