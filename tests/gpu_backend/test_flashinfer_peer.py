"""`gpu_backend.bench.flashinfer_peer` on the CPU: the smoke run (Triton interpreter, FlashInfer skipped) and the
summary rows. The smoke run checks that the FlashInfer-side page tables (indptr, indices, last-page lengths,
page size; one level for decode, two for the cascade) name the tokens our kernels read: a float64 reference
built from them matches our outputs."""
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gpu_backend.bench import flashinfer_peer as fp  # noqa: E402


def test_smoke_run_times_ours_and_says_why_flashinfer_did_not_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fp.main(["--smoke", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "flashinfer_peer.json").read_text())
    assert res["flashinfer"]["usable"] == [] and "smoke" in res["flashinfer"]["reason"]
    dec, cas = res["decode"]["rows"], res["cascade"]["rows"]
    assert sorted(r["page"] for r in dec) == [1, 16]
    assert {r["prefix"] for r in cas} == {"slab", "pages16"}
    for r in dec + cas:
        assert r["ours_max_abs_diff_vs_reference"] < 5e-3  # fp16 in the interpreter
        assert r["ours"]["us"] > 0 and r["floor_us"] > 0
    slab = next(r for r in cas if r["prefix"] == "slab")
    assert "ours_dense" in slab and slab["engine_path"] == "cascade"  # M_eff = 8 < M_sat
    summ = json.loads((tmp_path / "flashinfer_peer_summary.json").read_text())
    assert len(summ["decode"]) == len(dec) and len(summ["cascade"]) == len(cas)
    assert all("fi_us" not in r for r in summ["decode"] + summ["cascade"])


def _t(us):
    return {"us": us, "p10_us": us * 0.9, "p90_us": us * 1.1, "reps": 50, "mode": "graph"}


def test_summary_takes_the_faster_flashinfer_decode_and_the_adjacent_time_of_ours():
    res = {"meta": {"gpu": "NVIDIA H200"}, "ceilings": {"copy_GBps": 4000.0, "gemm_TFLOPs": 800.0},
           "flashinfer": {"version": "0.6.4", "usable": list(fp.FI_VARIANTS)}, "m_sat": 128.0,
           "decode": {"rows": [{"page": 16, "L": 4096, "B": 64, "copy_floor_us": 270.0, "ours": _t(300.0),
                                "ours_again": _t(290.0), "fi_decode_cuda_cores": _t(320.0),
                                "fi_decode_cuda_cores_max_abs_diff_vs_ours": 1e-3,
                                "fi_decode_tensor_cores": _t(310.0),
                                "fi_decode_tensor_cores_max_abs_diff_vs_ours": 2e-3,
                                "fi_best": "decode_tensor_cores"}]},
           "cascade": {"rows": [{"prefix": "slab", "L": 16384, "B": 64, "suffix": 257, "engine_path": "dense",
                                 "floor_us": 50.0, "copy_floor_us": 40.0, "bound": "gemm", "ours": _t(80.0),
                                 "ours_cascade": _t(90.0), "ours_dense": _t(80.0), "fi_cascade": _t(150.0),
                                 "fi_cascade_max_abs_diff_vs_ours": 4e-3, "fi_cascade_fa2": _t(120.0),
                                 "fi_cascade_fa2_max_abs_diff_vs_ours": 4e-3, "fi_best": "cascade_fa2"}]}}
    s = fp.summarize(res)
    (d,), (c,) = s["decode"], s["cascade"]
    assert d["ours_us"] == 290.0 and d["fi_us"] == 310.0 and d["fi_variant"] == "decode_tensor_cores"
    assert d["fi_over_ours"] == pytest.approx(310 / 290, rel=1e-3)
    assert d["ours_x_floor"] == pytest.approx(290 / 270, rel=1e-3)
    assert c["ours_us"] == 80.0 and c["fi_over_ours"] == pytest.approx(1.5) and c["fi_x_floor"] == pytest.approx(2.4)
    assert s["max_abs_diff_vs_ours"] == {"cascade": 4e-3, "cascade_fa2": 4e-3, "decode_cuda_cores": 1e-3,
                                         "decode_tensor_cores": 2e-3} and s["modes"] == ["graph"]
    assert c["ours_cascade_us"] == 90.0 and c["ours_dense_us"] == 80.0
    assert c["fi_variant"] == "cascade_fa2" and c["fi_cascade_us"] == 150.0
