"""Smoke test of the allocator benchmark: it runs, prints a table and writes its JSON (no timing checks)."""

import json

import pytest

from granisim.experiments import bench_alloc


def test_bench_alloc_writes_a_complete_report(tmp_path, capsys):
    out = tmp_path / "alloc.json"
    report = bench_alloc.run(str(out), repeats=1)
    saved = json.loads(out.read_text())
    assert saved["repeats"] == 1 and saved["machine"]["cpu_count"] >= 1
    for key in ("date", "python", "numpy", "git_commit", "command"):
        assert key in saved
    assert set(saved["targets"]) == set(bench_alloc.TARGETS) <= set(saved["results"])
    for s in saved["results"].values():
        assert s["min"] <= s["median"] <= s["max"] and s["median"] > 0
    assert set(saved["cycles"]) == {"granikv", "token", "paged16"}
    assert saved["cycles"]["granikv"]["hit_rate"] > 0
    assert report["results"].keys() == saved["results"].keys()
    assert "hot_allocate" in capsys.readouterr().out


def test_bench_alloc_rejects_zero_repeats():
    with pytest.raises(ValueError, match="got 0"):
        bench_alloc.run("", repeats=0)
