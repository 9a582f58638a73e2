"""`granisim validation idle-effect`: the same unit with and without idling, measured figures side by side."""

import json

import pandas as pd
import pytest

from granisim.validation.idle_effect import E2E, compare, main, run_figures


def _run(root, name, idle, tpot_p50, steps):
    run = root / name
    unit = "arxiv_replay_150_granikv_llama-3.1-8b" + ("" if idle else "_noidle")
    (run / unit).mkdir(parents=True)
    e2e = {k: {"measured": 1.0, "predicted": 1.0, "error": 0.0} for k in E2E}
    e2e["tpot_p50_s"]["measured"] = tpot_p50
    (run / f"validation_{unit}.json").write_text(json.dumps(
        {"end_to_end": e2e, "idle": idle, "idled_s": 7.5 if idle else 0.0, "wall_s": 60.0,
         "started_local": "2026-12-02T06:00:00", "ended_local": "2026-12-02T06:01:00"}))
    pd.DataFrame({"tokens": [1, 1, 4096], "measured_s": steps}).to_parquet(run / unit / "steps.parquet")
    return run


def test_each_mode_is_summarised_by_its_median_and_range_and_their_ratio(tmp_path):
    idle = [run_figures(_run(tmp_path, f"i{k}", True, t, [0.006, 0.008, 0.09]))
            for k, t in enumerate((0.008, 0.010, 0.009))]
    no = [run_figures(_run(tmp_path, f"n{k}", False, t, [0.006, 0.006, 0.1])) for k, t in enumerate((0.0099, 0.0099))]
    assert idle[0]["small_step_p50_s"] == pytest.approx(0.007) and idle[0]["large_step_p50_s"] == 0.09
    rows = {r["figure"]: r for r in compare(idle, no)}
    t = rows["tpot_p50_s"]
    assert (t["idle_median"], t["idle_min"], t["idle_max"]) == (0.009, 0.008, 0.010)
    assert t["ratio"] == pytest.approx(0.0099 / 0.009)
    assert rows["large_step_p50_s"]["ratio"] == pytest.approx(0.1 / 0.09)
    assert "power_capped_share" not in rows  # no clock log in these runs


def test_runs_listed_under_the_wrong_mode_or_of_other_units_are_refused(tmp_path):
    i = _run(tmp_path, "i", True, 0.01, [0.006, 0.006, 0.09])
    n = _run(tmp_path, "n", False, 0.01, [0.006, 0.006, 0.09])
    with pytest.raises(ValueError, match="listed under the other mode"):
        main(["--idle", str(n), "--no-idle", str(i)])
    other = tmp_path / "o"
    renamed = _run(tmp_path, "o_src", False, 0.01, [0.006, 0.006, 0.09])
    (renamed / "validation_arxiv_replay_150_granikv_llama-3.1-8b_noidle.json").rename(
        renamed / "validation_azure_replay_granikv_llama-3.1-8b_noidle.json")
    (renamed / "arxiv_replay_150_granikv_llama-3.1-8b_noidle").rename(
        renamed / "azure_replay_granikv_llama-3.1-8b_noidle")
    with pytest.raises(ValueError, match="not all of the same unit"):
        main(["--idle", str(i), "--no-idle", str(renamed)])
    with pytest.raises(ValueError, match="no such run folder"):
        main(["--idle", str(other), "--no-idle", str(n)])
