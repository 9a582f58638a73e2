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


def test_validate_writes_a_report(tmp_path, capsys):
    """The report's per-step errors are those of the stored plans re-priced: each plan in plans.pkl matches its
    row of steps.parquet (step, batch, tokens), its cost-model price is the row's prediction, and the median
    and p90 of |predicted - measured| / measured, recomputed here, are the report's (total and per key).
    Planted bugs: the error taken relative to the prediction (``/ meas`` -> ``/ pred`` in validate._rel) fails
    the recomputed medians; the paired executor pricing another plan than the one it stores (the plan read as
    16-token pages, ``replace(plan, page_size=16)``) fails the re-priced predictions."""
    sc = tmp_path / "tiny.toml"
    sc.write_text('name = "tiny"\n[model]\nname = "tiny"\n[hardware]\nkv_budget_tokens = 512\n'
                  "[workload]\nroles = 1\nprefix_len = 24\nnum_requests = 3\nrate = 100.0\n"
                  "suffix_scale = 0.01\nmax_output_len = 3\n")
    out = tmp_path / "val"
    assert main(["validate", str(sc), "--device", "cpu", "--out", str(out)]) == 0
    rep = json.loads((out / "validation.json").read_text())
    steps = pd.read_parquet(out / "steps.parquet")
    plans = load_plans(out / "plans.pkl")
    assert rep["steps"] == len(steps) == len(plans) >= 3
    assert (out / "validation.png").exists()
    assert "Per step" in capsys.readouterr().out

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
