"""gpu_backend/bench/attention_after_gemm.py: runs on the CPU, and its table pairs each round's two modes."""

import json

import pytest

from gpu_backend.bench.attention_after_gemm import main, parse_args, table


def test_smoke_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMIT", "abc1234")
    assert main(["--out", str(tmp_path), "--smoke", "--rounds", "1", "--models", "llama-3.1-8b",
                 "--cases", "8192:0"]) == 0
    res = json.load(open(tmp_path / "attention_after_gemm.json"))
    assert {(r["model"], r["tokens"], r["context"], r["mode"]) for r in res["rows"]} == {
        ("llama-3.1-8b", 64, 0, mode) for mode in ("flushed", "alone", "dirtied", "in_layer", "in_layer_gap")}
    assert all(r["attn_us"] > 0 for r in res["rows"])
    assert len(res["table"]) == 1 and res["table"][0]["rounds"] == 1
    assert (tmp_path / "attention_after_gemm.md").read_text().startswith("| model |")
    # the run names its machine and code
    assert res["gpu"] == "cpu" and res["commit"] == "abc1234" and res["software"].startswith("torch ")
    assert res["date"].endswith("+00:00")


def test_ratios_pair_the_modes_of_one_round():
    rows = [{"model": "m", "tokens": 8, "context": 0, "mode": mode, "round": r, "attn_us": us, "gemm_us": g}
            for r, (f, b) in enumerate([(100.0, 110.0), (200.0, 210.0), (100.0, 130.0)])
            for mode, us, g in (("flushed", f, None), ("in_layer", b, 5.0))]
    (t,) = table(rows, [])
    # per round 1.10, 1.05, 1.30: a ratio of medians (110 / 100 = 1.10 by chance here) would not give the range
    assert t["in_layer_ratio"] == pytest.approx((1.10, 1.05, 1.30))
    assert t["flushed_us"] == 100.0 and t["in_layer_us"] == 130.0 and t["gemm_us"] == 5.0
    assert t["alone_ratio"] is None and t["alone_us"] is None  # a mode not run


@pytest.mark.parametrize("bad", [["--cases", "8192"], ["--cases", "0:0"], ["--rounds", "0"]])
def test_bad_arguments_exit_2(tmp_path, bad):
    with pytest.raises(SystemExit) as e:
        parse_args(["--out", str(tmp_path), *bad])
    assert e.value.code == 2
