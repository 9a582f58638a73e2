"""`gpu_backend.bench.goals`: the kernel issue's goal rows from the committed GPU reports (no GPU)."""
import json

import pytest

from gpu_backend.bench import goals


def _kernels(cascade_x, dense_vs, extend_tflops):
    return {"sections": {
        "ceilings": {"gemm_TFLOPs": 800.0, "copy_GBps": 4000.0},
        "cascade": {"rows": [{"L": L, "x_floor": 9.0, "graph": {"x_floor": x}} for L, x in cascade_x]},
        "dense": {"rows": [{"M_eff": m, "vs_sdpa": v} for m, v in dense_vs]},
        "extend": {"rows": [{"L": L, "TFLOPs": t} for L, t in extend_tflops]}}}


def test_kernel_rows_judge_every_point_of_their_range():
    """A cascade point under 4K tokens and a dense point below M_sat are outside the goals' ranges; inside, the
    worst point decides (cascade: its max over floor, graph time where timed; dense: its min against SDPA)."""
    rows = {r["name"].split(",")[0].split(" (")[0]: r for r in goals.kernel_rows(_kernels(
        [(1024, 5.0), (4096, 1.2), (16384, 1.29)], [(64, 0.2), (128, 1.1), (1024, 1.0)], [(4096, 500.0)]), 128.0)}
    casc = rows["cascade prefix pass"]
    assert casc["measured"]["max"] == pytest.approx(1.29) and casc["measured"]["points"] == 2 and casc["met"]
    dense = rows["dense pass vs torch SDPA where dispatched"]
    assert dense["measured"]["min"] == pytest.approx(1.0) and dense["met"]
    ext = rows["extend over cached prefixes"]
    assert ext["measured"]["median"] == pytest.approx(500.0 / 800.0) and ext["met"]
    assert rows["peer: FlashInfer cascade / decode on the same problems"]["met"] is False
    worse = goals.kernel_rows(_kernels([(4096, 1.31)], [(256, 0.99)], [(8192, 400.0)]), 128.0)
    assert [r["met"] for r in worse[:3]] == [False, False, False]


def test_dense_row_reads_graph_replays_where_timed():
    """A dense point timed as graph replays is judged by them (as the engine runs it), not by its plain launches."""
    k = _kernels([(4096, 1.0)], [(256, 0.5), (512, 1.2)], [(4096, 500.0)])
    k["sections"]["dense"]["rows"][0]["graph_vs_sdpa"] = 1.1
    dense = goals.kernel_rows(k, 128.0)[1]
    assert dense["measured"]["min"] == pytest.approx(1.1) and dense["met"]
    k["sections"]["dense"]["rows"][1]["graph_vs_sdpa"] = 0.9
    assert goals.kernel_rows(k, 128.0)[1]["met"] is False


def test_engine_rows_take_the_lowest_point_of_the_grid_mean_over_repetitions():
    def unit(g, t, p):
        return {"granikv": g, "token": t, "paged16": p}

    sp = {"points": [
        {"lp": 16384, "k": 4, "units": unit({"0": {"throughput_rps": 6.0}}, {"0": {"throughput_rps": 4.0}},
                                            {"0": {"throughput_rps": 5.0}})},
        {"lp": 1024, "k": 1, "units": unit({"0": {"throughput_rps": 9.0}, "1": {"throughput_rps": 11.0}},
                                           {"0": {"throughput_rps": 10.0}, "1": {"throughput_rps": 10.0}},
                                           {"0": {"throughput_rps": 9.0}, "1": {"throughput_rps": 10.0}})}]}
    rows = goals.engine_rows(sp)
    assert rows[0]["measured"] == pytest.approx(1.5) and rows[1]["measured"] == pytest.approx(1.2)
    low = rows[2]
    assert low["measured"] == pytest.approx(1.0) and low["met"]  # token at 1K: (0.9 + 1.1) / 2, not rep 0's 0.9
    assert "against token" in low["note"]
    assert all(r["measured"] is None and r["met"] is False for r in rows[3:])


def test_summaries_from_the_committed_reports(tmp_path):
    """Both files are written from the committed reports; each row names its source; the decode step's floor parts
    are the weights and the four 16K prefixes at the run's copy rate (3.76 and 2.01 ms)."""
    assert goals.main(["--kernels", str(tmp_path / "k.json"), "--engine", str(tmp_path / "e.json")]) == 0
    k, e = (json.loads((tmp_path / f).read_text()) for f in ("k.json", "e.json"))
    for doc in (k, e):
        assert doc["rows"] and all({"name", "measured", "goal", "met", "source"} <= set(r) for r in doc["rows"])
        assert all(any(r["source"].startswith(s) for s in doc["measured_in"]) or r["source"] == "none" for r in doc["rows"])
    step = k["rows"][0]
    assert "weights 3.76 + prefix KV 2.01" in step["goal"]
    measured = step["measured"]  # a spread over repetitions where the host-work run is committed
    assert step["met"] == ((measured["median"] if isinstance(measured, dict) else measured) <= 9.2)


def test_paper_rows_take_each_repetitions_ratio_and_need_three():
    """Ratios within each repetition (a machine drift between repetitions cancels), their mean against the goal,
    met only with n >= 3; a repetition missing its baseline is left out; no units: rows without a measurement."""
    def u(pol, rep, rps, lp=16384):
        return {"lp": lp, "policy": pol, "rep": rep, "throughput_rps": rps}

    units = [u("granikv", 0, 6.0), u("token", 0, 3.0), u("granikv", 1, 8.8), u("token", 1, 4.0),
             u("granikv", 2, 5.2), u("token", 2, 2.0), u("paged16", 0, 3.0), u("paged16", 1, 4.4)]
    rows = {r["name"]: r for r in goals.paper_rows(units, "reports/engine/paper_setting")}
    tok = rows["paper's setting, L_p = 16K, k = 4: granikv / token throughput"]
    assert tok["measured"] == {"min": pytest.approx(2.0), "mean": pytest.approx(6.8 / 3), "max": pytest.approx(2.6),
                               "points": 3}  # pooled sums would give 20.0 / 9.0 = 2.22
    assert tok["met"] is True
    pg = rows["paper's setting, L_p = 16K, k = 4: granikv / paged16 throughput"]
    assert pg["measured"]["points"] == 2 and pg["met"] is False  # 2.0 and 2.0 >= 1.8, but only two repetitions
    assert rows["paper's setting, L_p = 4K, k = 4: granikv / token throughput"]["met"] is None
    none = goals.paper_rows([], "x")
    assert [r["measured"] for r in none] == [None] * 4 and [r["met"] for r in none] == [False, False, None, None]


def test_host_work_rows_take_the_committed_executor_over_plain_repetitions():
    """The decode step's total and host part come from the host-work run's granikv units under the committed
    executor ('after'), median over its plain repetitions (a probe unit, slowed by its wrappers, left out), with the
    earlier executor's figure of the same run in the note; a run on another GPU or at another point is not taken."""
    def unit(v, step, ov, probe=False, policy="granikv"):
        return {"policy": policy, "variant": v, "probe": probe,
                "decode": {"step_ms_p50": step, "overhead_ms_p50": ov}}

    doc = {"meta": {"gpu": "NVIDIA H200", "args": {"lp": 16384, "k": 4}},
           "units": [unit("before", 13.9, 1.6), unit("after", 12.5, 0.3), unit("after", 12.7, 0.5),
                     unit("after", 12.6, 0.4), unit("after", 20.0, 9.0, probe=True),
                     unit("after", 30.0, 5.0, policy="token")]}
    host = goals.host_work(doc)
    assert host["after"]["overhead"]["median"] == pytest.approx(0.4) and host["after"]["overhead"]["points"] == 3
    assert host["before"]["step"]["median"] == pytest.approx(13.9)
    sp = json.loads(goals.SPEEDUPS.read_text())
    rows = goals.decode_step_rows(sp, 4000.0, host, "HOST")
    step, ov = rows[0], rows[-1]
    assert step["measured"]["median"] == pytest.approx(12.6) and step["source"].startswith("HOST")
    assert ov["measured"]["median"] == pytest.approx(0.4) and ov["met"] is False and "1.60 ms" in ov["note"]
    assert goals.host_work({**doc, "meta": {**doc["meta"], "gpu": "NVIDIA H100 80GB HBM3"}}) is None
    assert goals.host_work({**doc, "meta": {**doc["meta"], "args": {"lp": 4096, "k": 4}}}) is None
    assert goals.decode_step_rows(sp, 4000.0)[-1]["source"].startswith("reports/engine/speedups.json")
