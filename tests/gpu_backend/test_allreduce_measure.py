"""calibration/measure/allreduce.py: the section runs on the CPU (gloo, two ranks) and its fit recovers a known
all-reduce curve, with the held-out error of a fit on every other size; the profile it writes loads, marked
measured, and prices an all-reduce as fitted."""

import csv
import json
import shutil

import numpy as np
import pytest

from calibration.measure.allreduce import SIZES, fit, main, write_profile
from granisim.config.hardware import PROFILE_DIR, load_profile
from granisim.costmodel.parallel import allreduce_seconds, allreduce_time


def test_smoke_on_cpu(tmp_path):
    assert main(["--out", str(tmp_path), "--smoke"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "allreduce.csv")))
    assert {int(r["tp"]) for r in rows} == {2} and len(rows) == 4
    assert all(float(r["median_us"]) > 0 and float(r["busbw"]) > 0 for r in rows)
    assert set(json.loads((tmp_path / "fit.json").read_text())) == {"2"}


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--tp", "3"]) == 2
    assert main(["--out", str(tmp_path), "--smoke", "--profile", str(tmp_path / "p.json")]) == 2
    assert "--tp 3" in capsys.readouterr().err


def test_fit_recovers_a_known_curve_and_writes_the_profile(tmp_path):
    rng = np.random.default_rng(0)
    truth = {2: (7e-6, 370e9), 8: (12e-6, 340e9)}
    rows = [dict(tp=tp, bytes=b, median_us=allreduce_time(lat, bw, tp, b) * (1 + rng.normal(0, 0.01)) * 1e6)
            for tp, (lat, bw) in truth.items() for b in SIZES]
    got = fit(rows)
    for tp, (lat, bw) in truth.items():
        assert got[tp]["latency_s"] == pytest.approx(lat, rel=0.05)
        assert got[tp]["busbw"] == pytest.approx(bw, rel=0.03)
        assert got[tp]["held_out_median"] < 0.03 and got[tp]["sizes"] == len(SIZES)
    prof = tmp_path / "h200.json"
    shutil.copy(PROFILE_DIR / "h200.json", prof)
    write_profile(prof, got, {"kind": "measured", "date": "2026-12-03", "command": "test", "gpu": "test"})
    p = load_profile(prof)
    assert p.coefficients["comm.allreduce.tp8.busbw"].source.kind == "measured"
    assert p.coefficients["comm.allreduce.tp4.busbw"].source.kind == "extrapolated"  # not measured: kept
    s = 64 << 20
    assert allreduce_seconds(p, 2, s) == pytest.approx(allreduce_time(got[2]["latency_s"], got[2]["busbw"], 2, s))
