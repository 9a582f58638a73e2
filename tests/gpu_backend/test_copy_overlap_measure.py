"""calibration/measure/copy_overlap.py: the section runs on the CPU, and its fit inverts the cost model's formula."""

import csv
import json

import pytest

from calibration.measure.copy_overlap import FIELDS, fit, main, overlap
from granisim.costmodel.transfers import exposed_seconds


def test_smoke_on_cpu(tmp_path):
    assert main(["--out", str(tmp_path), "--smoke"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "copy_overlap.csv")))
    assert list(rows[0]) == FIELDS
    # 2 step sizes x 2 directions x 2 copy/compute ratios
    assert {(r["rows"], r["direction"], r["ratio_target"]) for r in rows} == {
        (n, d, q) for n in ("4", "16") for d in ("to_host", "to_gpu") for q in ("1.25", "2.0")}
    for r in rows:
        assert 0 < int(r["tokens"]) <= 32768
        assert all(float(r[f"{k}_median_us"]) > 0 for k in ("compute", "copy", "both"))
    run = json.load(open(tmp_path / "copy_overlap.json"))
    assert {"date", "commit", "torch", "triton", "gpu"} <= set(run["meta"])
    assert run["fit"]["points"] + run["fit"]["excluded"] == len(rows)
    fitted = fit(rows)  # from the CSV's strings: the JSON's figure
    assert fitted["points"] == run["fit"]["points"]
    if fitted["points"]:
        assert fitted["host.overlap"] == pytest.approx(run["fit"]["host.overlap"])


def _row(tc, tx, tb):
    return {"compute_median_us": tc * 1e6, "copy_median_us": tx * 1e6, "both_median_us": tb * 1e6}


def test_overlap_ends():
    assert overlap(10.0, 15.0, 25.0) == 0.0  # serial: nothing hidden
    assert overlap(10.0, 15.0, 15.0) == 1.0  # the copy runs wholly beside the compute


def test_fit_inverts_the_cost_model():
    """Joint times made by granisim's own formula from known overlaps are fitted back to them."""
    rows = []
    for ov, tc, ratio in ((0.55, 3e-3, 1.25), (0.7, 40e-3, 2.0), (0.9, 12e-3, 1.5)):
        tx = ratio * tc
        rows.append(_row(tc, tx, tc + exposed_seconds(tx, tc, {"host.overlap": ov})))
    # a copy shorter than its compute, wholly hidden: says nothing about the overlap (it would read 0.4)
    rows.append(_row(10e-3, 4e-3, 10e-3))
    got = fit(rows)
    assert got["host.overlap"] == pytest.approx(0.7)
    assert got["overlap_min"] == pytest.approx(0.55)
    assert got["overlap_max"] == pytest.approx(0.9)
    assert (got["points"], got["excluded"]) == (3, 1)


@pytest.mark.parametrize("args,needle", [(["--reps", "0"], "--reps must be at least 1, got 0"),
                                         (["--max-tokens", "-5"], "--max-tokens must be at least 1, got -5"),
                                         (["--model", "llama-9"], "--model: unknown model 'llama-9'")])
def test_bad_arguments_exit_2_naming_them(tmp_path, capsys, args, needle):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--smoke", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "copy_overlap.csv").exists()
