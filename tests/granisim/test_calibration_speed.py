"""`granisim calibrate fit` on the shipped H200 raw data gives the shipped profile back, within the
fit's tolerance, with the bounded least-squares solver (scipy TRF) and warm-started folds.

The attention / KV kernel coefficients are compared through what the simulator uses them for:
each calibration row's predicted time under the refitted coefficients against the shipped
profile's, per family a median within 1% and every row within 5% (the fit's own held-out error
is 1-9% median, reports/calibration/). Some coefficients are barely constrained by these rows
(prefill flop_eff, cascade sat_ctas_per_sm) and may move far at nearly the same error, so they
are not compared one by one. Every other fitted value (linear rooflines, HBM ceiling, per-step
overhead, M_sat, the whole-number tile choices) must match to 1e-4.

Shown to catch a wrong fit: with the final fit warm-started from the last fold's solution instead
of the start values (the order swapped in fit_attention), or with the solver stopped after 3
evaluations (max_nfev=3), the prediction check fails.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from granisim.calibration.fit import DISCRETE, FAMILY_PARAMS
from granisim.calibration.fit_linear import host_bound, host_floor
from granisim.calibration.raw import load_raw, predict_attention
from granisim.calibration.run import calibrate
from granisim.config.hardware import get_profile
from granisim.config.models import get_model

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "calibration" / "raw" / "h200"
SHIPPED = ROOT / "granisim" / "config" / "profiles" / "h200.json"


@pytest.fixture(scope="module")
def refit(tmp_path_factory):
    out = tmp_path_factory.mktemp("refit") / "h200.json"
    cal = calibrate(RAW, out, name="h200", folds=1)
    return cal, json.loads(out.read_text())["coefficients"]


def test_refit_predicts_the_shipped_profiles_times(refit):
    cal, _ = refit
    raw = load_raw(RAW)
    model = get_model(raw.meta.get("model", "llama-3.1-8b"))
    shipped = {k: c.value for k, c in get_profile("h200").coefficients.items()}
    new = dict(shipped)
    new.update({n: cal.result.values[n] for ps in FAMILY_PARAMS.values() for n, _, _ in ps})
    new.update({n: cal.result.values[n] for n in DISCRETE.values()})
    df = raw.attention[~host_bound(raw.attention, host_floor(raw))].reset_index(drop=True)
    ratio = predict_attention(new, df, model) / predict_attention(shipped, df, model)
    dev = df.assign(dev=np.abs(ratio - 1.0)).groupby("family")["dev"]
    bad = {fam: (round(med, 4), round(mx, 4)) for fam, med, mx in zip(dev.median().index, dev.median(), dev.max())
           if not (med <= 0.01 and mx <= 0.05)}
    assert not bad, f"refitted predictions off the shipped profile's (median, max relative difference): {bad}"


def test_refit_matches_every_other_shipped_coefficient(refit):
    _, coefs = refit
    shipped = json.loads(SHIPPED.read_text())["coefficients"]
    loose = {n for ps in FAMILY_PARAMS.values() for n, _, _ in ps} | {"overhead.kernel_launch_s",
                                                                       "attn.decode.flop_eff"}
    compared = off = 0
    diffs = []
    for k, c in coefs.items():
        if k in loose or k not in shipped or shipped[k]["source"].get("kind") != "measured":
            continue
        a, b = float(c["value"]), float(shipped[k]["value"])
        compared += 1
        if abs(a - b) > 1e-4 * max(abs(b), 1e-30):
            off += 1
            diffs.append(f"{k}: {a:.6g} vs shipped {b:.6g}")
    assert compared >= 20 and not diffs, diffs


def test_a_refit_does_not_claim_a_factor_other_runs_measure(refit):
    """The skewed decode's factor comes from the split-balance benchmark (granisim calibrate skew), not from a
    calibration run: a refit leaves it out rather than writing the start profile's value as measured by itself (a
    derived b200 then carried the H200's factor with the calibration run's date)."""
    _, coefs = refit
    assert "attn.decode.skew_stream" not in coefs
    assert get_profile("h200").coefficients["attn.decode.skew_stream"].source.date == "2026-11-29"
