"""granisim validation paper-setting: the paper's setting measured against the simulator's prediction."""
import json

import pytest

from granisim.validation import paper_setting as ps


def unit(pol: str, rep: int, thr: float, tpot99: float = 0.3, lp: int = 16384) -> dict:
    return {"lp": lp, "policy": pol, "rep": rep, "throughput_rps": thr, "tpot_p50_s": 0.05, "tpot_p99_s": tpot99,
            "ttft_p50_s": 1.0, "ttft_p99_s": 3.0}


def pred(thr: float) -> dict:
    return {"throughput_rps": thr, "tpot_p50_s": 0.05, "tpot_p99_s": 0.25, "ttft_p50_s": 1.1, "ttft_p99_s": 3.0}


UNITS = [unit("granikv", 0, 6.0, 0.30), unit("token", 0, 4.0), unit("granikv", 1, 6.6, 0.36), unit("token", 1, 4.4),
         unit("token", 2, 4.2)]  # repetition 2 lost its granikv unit
PRED = {(16384, "granikv"): pred(6.0), (16384, "token"): pred(4.0)}


def test_rows_set_the_prediction_against_the_mean_of_the_repetitions():
    rows = {r["policy"]: r for r in ps.rows(UNITS, PRED)}
    g = rows["granikv"]
    assert g["reps"] == 2 and rows["token"]["reps"] == 3
    assert g["throughput_rps"]["measured"] == pytest.approx(6.3)
    assert (g["throughput_rps"]["min"], g["throughput_rps"]["max"]) == (6.0, 6.6)
    assert g["throughput_rps"]["error"] == pytest.approx((6.0 - 6.3) / 6.3)  # signed: optimistic is negative
    assert g["tpot_p99_s"]["error"] == pytest.approx((0.25 - 0.33) / 0.33)


def test_ratios_pair_policies_within_a_repetition():
    (r,) = ps.ratios(UNITS, PRED)
    assert r["baseline"] == "token"
    assert r["measured"] == pytest.approx([6.0 / 4.0, 6.6 / 4.4])  # repetition 2 has no granikv: left out
    assert r["predicted"] == pytest.approx(1.5)


def test_sensitivity_is_the_change_against_the_unscaled_prediction():
    scaled = {1.02: {k: {**v, "tpot_p99_s": v["tpot_p99_s"] * 1.1} for k, v in PRED.items()}}
    rows = ps.sensitivity(PRED, scaled)
    assert [(r["policy"], r["factor"]) for r in rows] == [("granikv", 1.02), ("token", 1.02)]
    assert rows[0]["tpot_p99_s"] == pytest.approx(0.1) and rows[0]["throughput_rps"] == 0
    text = ps.format_table(ps.rows(UNITS, PRED), ps.ratios(UNITS, PRED), "h200-engine", rows)
    assert "| 16384 | granikv | 1.02 | +0.0% | +0.0% | +10.0% |" in text


def test_a_folder_without_units_or_with_a_broken_one_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="no paper_lp"):
        ps.load_units(tmp_path)
    (tmp_path / "paper_lp16384_token_rep0.json").write_text(json.dumps({"lp": 16384, "policy": "token"}))
    with pytest.raises(ValueError, match="paper_lp16384_token_rep0.json: field rep missing"):
        ps.load_units(tmp_path)


def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        ps.main([str(tmp_path)])
    assert stop.value.code == 2 and "no paper_lp" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        ps.main([str(tmp_path), "--sensitivity", "-1"])
    assert stop.value.code == 2


def test_step_classes_and_their_medians_per_repetition():
    import pandas as pd

    assert ps.step_class([0, 1, 2048, 2049, 8192, 8193]) == [
        "decode", "prefill <= 2048", "prefill <= 2048", "prefill <= 4096", "prefill <= 8192", "prefill > 8192"]
    a = pd.DataFrame({"prefill_tokens": [0, 0, 0, 4000], "duration_s": [0.01, 0.02, 0.03, 0.2]})
    b = pd.DataFrame({"prefill_tokens": [0, 0, 4000, 4000], "duration_s": [0.04, 0.05, 0.3, 0.4]})
    med = ps.step_medians([a, b])
    assert med["decode"] == (2, 0.03)  # 5 decode steps over 2 frames: 2 a frame (rounded), median of all 5
    assert med["prefill <= 4096"] == (2, 0.3)
