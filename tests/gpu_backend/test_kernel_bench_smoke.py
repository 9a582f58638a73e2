"""CPU smoke runs of the kernel benchmarks (Triton interpreter, tiny shapes): they run, write every point and
refuse bad arguments; their GPU figures come from the device runs named in reports/."""
import json

import pytest

from gpu_backend.bench import dense_splits, extend_tiles, layer_elementwise, slab_small_m


def test_layer_elementwise_smoke_run(tmp_path, capsys):
    """Both sides of every point written; an unknown model refused (exit 2)."""
    assert layer_elementwise.main(["--out", str(tmp_path), "--smoke", "--models", "llama-3.1-8b"]) == 0
    points = json.loads((tmp_path / "layer_elementwise.json").read_text())["points"]
    assert [p["rows"] for p in points] == [1, 5]
    assert all(p["torch"]["median_us"] > 0 and p["fused"]["median_us"] > 0 and p["layers"] == 32 for p in points)
    with pytest.raises(SystemExit) as e:
        layer_elementwise.main(["--out", str(tmp_path), "--models", "llama-9"])
    assert e.value.code == 2 and "llama-9" in capsys.readouterr().err


def test_slab_small_m_smoke_run(tmp_path):
    """Every variant computes the cascade's result on every point (fp16 in the interpreter)."""
    assert slab_small_m.main(["--out", str(tmp_path), "--smoke"]) == 0
    rows = json.loads((tmp_path / "slab_small_m.json").read_text())["rows"]
    assert len(rows) == 2
    for r in rows:
        for name in ("cascade", "dense_m64", "dense_m128"):
            assert r[name]["us"] > 0 and r[name]["max_abs_diff_vs_cascade"] < 4e-3, (name, r)


def test_dense_splits_smoke_run(tmp_path):
    """Every split count of every point computes the unsplit result, the rule's pick is timed, the best is the
    fastest timed count."""
    assert dense_splits.main(["--out", str(tmp_path), "--smoke"]) == 0
    rows = json.loads((tmp_path / "dense_splits.json").read_text())["rows"]
    assert [(r["G"], r["L"]) for r in rows] == [(4, 256), (5, 384)]
    for r in rows:
        counts = {int(n) for n in r["splits"]}
        assert counts == set(range(1, r["L"] // 128 + 1)), r
        assert all(s["max_abs_diff_vs_unsplit"] < 4e-3 for s in r["splits"].values()), r
        assert r["best_us"] == min(s["us"] for s in r["splits"].values()) and r["rule"]["us"] > 0
    again = dense_splits.rescore(tmp_path / "dense_splits.json")  # today's rule picks a count the run timed
    assert [a["now_us"] for a in again] == [r["splits"][str(a["now_splits"])]["us"] for a, r in zip(again, rows)]
    with pytest.raises(SystemExit) as e:
        dense_splits.main(["--rescore", str(tmp_path / "missing.json")])
    assert e.value.code == 2


def test_extend_tiles_smoke_run(tmp_path, capsys):
    """Every config of every point computes the first config's result, the best is the fastest; a malformed
    config is refused (exit 2)."""
    assert extend_tiles.main(["--out", str(tmp_path), "--smoke"]) == 0
    rows = json.loads((tmp_path / "extend_tiles.json").read_text())["rows"]
    assert [(r["storage"], r["G"]) for r in rows] == [("slots", 4), ("pages16", 5)]
    for r in rows:
        assert list(r["configs"]) == extend_tiles.SMOKE_CONFIGS
        assert all(c["max_abs_diff_vs_first"] < 4e-3 and c["us"] > 0 for c in r["configs"].values()), r
        assert r["configs"][r["best"]]["us"] == min(c["us"] for c in r["configs"].values())
        first = r["configs"][extend_tiles.SMOKE_CONFIGS[0]]["us"]
        assert r["first_over_best"] == first / r["configs"][r["best"]]["us"]
    with pytest.raises(SystemExit) as e:
        extend_tiles.main(["--out", str(tmp_path), "--configs", "128x64w8"])
    assert e.value.code == 2 and "128x64w8" in capsys.readouterr().err
