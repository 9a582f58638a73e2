"""Linear tables at several model shapes: a model is priced from the measured table nearest its shape;
`granisim calibrate table` adds one from a linear-only calibration run."""

import json
import shutil
import subprocess
import sys

import pytest

from granisim.calibration.raw import synthetic_raw
from granisim.config.hardware import DATA_DIR, PROFILE_DIR, ProfileError, load_profile
from granisim.config.models import get_model, measured_shape
from granisim.costmodel.tables import CostTables, nearest_linear_table

QWEN = get_model("qwen-2.5-14b")
QWEN_TABLE = "h200_qwen-2.5-14b_linear_ops.csv"
SIZES = (1, 48, 256, 3000, 8192, 20000)


def _profile(tmp_path, name, primary=None, more=()):
    """h200 with its primary linear table replaced by ``primary`` and ``more_linear_tables`` set to ``more``."""
    d = json.loads((PROFILE_DIR / "h200.json").read_text())
    d.pop("more_linear_tables", None)
    if primary is not None:
        d["linear_table"] = primary
    if more:
        d["more_linear_tables"] = list(more)
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(d))
    return load_profile(p)


def _qwen_entry():
    base = json.loads((PROFILE_DIR / "h200.json").read_text())["linear_table"]
    return {**base, "file": QWEN_TABLE, "model": QWEN.table_shape()}


def _linear(profile, model):
    t = CostTables(profile, model)
    return [t.linear_time(n) for n in SIZES]


def test_a_model_with_a_table_at_its_shape_is_priced_from_it_and_the_others_are_not(tmp_path):
    only_llama = _profile(tmp_path, "a")
    both = _profile(tmp_path, "b", more=[_qwen_entry()])
    only_qwen = _profile(tmp_path, "c", primary=_qwen_entry())
    assert _linear(both, QWEN) == _linear(only_qwen, QWEN) != _linear(only_llama, QWEN)
    llama = get_model("llama-3.1-8b")
    assert _linear(both, llama) == _linear(only_llama, llama) != _linear(only_qwen, llama)


def test_a_shape_between_tables_is_carried_from_the_nearest():
    """Qwen-2.5-32B differs from Qwen-2.5-14B only in its MLP width: it is nearer than Llama-3.1-8B or a shard."""
    prof = load_profile(PROFILE_DIR / "h200.json")
    _, _, ref = nearest_linear_table(prof, get_model("qwen-2.5-32b"))
    assert ref.table_shape() == QWEN.table_shape()
    _, _, ref = nearest_linear_table(prof, get_model("llama-3.1-8b"))
    assert ref.table_shape() == measured_shape(prof.linear_table.model).table_shape()
    shard = get_model("llama-3.1-70b").shard(8)  # its own measured shard rows
    _, _, ref = nearest_linear_table(prof, shard)
    assert ref.table_shape() == shard.table_shape()


def test_more_tables_need_a_primary_table(tmp_path):
    d = json.loads((PROFILE_DIR / "h200.json").read_text())
    d.pop("linear_table")
    p = tmp_path / "x.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=r"field more_linear_tables: value \d+: needs a linear_table"):
        load_profile(p)


def _nan_cell(lines):
    cells = lines[2].split(",")
    cells[4] = "nan"
    return [*lines[:2], ",".join(cells), *lines[3:]]


@pytest.mark.parametrize("edit, why", [(_nan_cell, "row 2, column"),
                                       (lambda lines: lines[:1], "needs at least two num_tokens rows")])
def test_a_bad_more_table_names_its_entry(tmp_path, edit, why):
    lines = edit((DATA_DIR / QWEN_TABLE).read_text().splitlines())
    (tmp_path / "bad.csv").write_text("\n".join(lines) + "\n")
    d = json.loads((PROFILE_DIR / "h200.json").read_text())
    d["more_linear_tables"][0]["file"] = "bad.csv"
    p = tmp_path / "x.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=rf"field more_linear_tables\.0\.file: .*{why}"):
        load_profile(p)


def _cli(*args):
    code = "import sys; from granisim.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)


def test_calibrate_table_adds_a_measured_table_that_prices_its_model(tmp_path):
    prof = load_profile(PROFILE_DIR / "h200.json")
    values = {k: c.value for k, c in prof.coefficients.items()}
    raw = synthetic_raw(values, tmp_path / "raw", model="qwen-2.5-14b")
    (raw / "attention.csv").unlink()  # a linear-only run
    d = json.loads((PROFILE_DIR / "h200.json").read_text())
    d.pop("more_linear_tables")
    target = tmp_path / "mine.json"
    target.write_text(json.dumps(d))
    shutil.copy(DATA_DIR / "h200_llama-3.1-8b_linear_ops.csv", tmp_path)
    shutil.copy(DATA_DIR / "h200_llama-3.1-8b_kernels.csv", tmp_path)
    for _ in range(2):  # a second run replaces the entry
        r = _cli("calibrate", "table", str(raw), "--profile", str(target))
        assert r.returncode == 0, r.stderr
    assert "held out, interpolated: median" in r.stdout and "GEMMs priced from the other tables: median" in r.stdout
    mine = load_profile(target)
    assert len(mine.more_linear_tables) == 1 and mine.more_linear_tables[0].source.kind == "measured"
    ns, ops, ref = nearest_linear_table(mine, QWEN)
    assert ref.table_shape() == QWEN.table_shape() and ops is mine.more_linear_tables[0].ops_ms
    # the synthetic timings are the roofline's: the table reproduces them at a measured size
    t = CostTables(mine, QWEN)
    roof = CostTables(mine, QWEN, use_table=False)
    roof._lin_grid = None
    assert t.linear_time(4096) == pytest.approx(roof.linear_time(4096), rel=0.02)


def test_calibrate_table_refuses_a_folder_without_timings(tmp_path):
    r = _cli("calibrate", "table", str(tmp_path), "--profile", str(PROFILE_DIR / "h200.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "meta.json" in r.stderr and "no such file" in r.stderr



def test_calibrate_table_from_shard_gemms_prices_each_tp_from_its_own_rows(tmp_path):
    """A linear_tp run (the GEMMs at Llama-3.1-70B's shard shapes, measured on an H200) becomes a table of tp rows
    alone: a tp = 4 shard is priced from the tp = 4 GEMMs as measured; tp = 1 and other models are not."""
    import csv as csvlib
    from pathlib import Path

    raw = Path(__file__).resolve().parents[2] / "calibration" / "raw" / "h200_more" / "llama-3.1-70b_linear_tp"
    d = json.loads((PROFILE_DIR / "h200.json").read_text())
    d["more_linear_tables"] = [t for t in d["more_linear_tables"] if "shard" not in t["file"]]
    target = tmp_path / "mine.json"
    target.write_text(json.dumps(d))
    r = _cli("calibrate", "table", str(raw), "--profile", str(target), "--table-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "tp 4, held out, interpolated: median" in r.stdout and "tp 8, GEMMs priced from the other tables" in r.stdout
    mine = load_profile(target)
    shard_tab = next(t for t in mine.more_linear_tables if "shard" in t.path.name)
    assert not shard_tab.num_tokens and sorted(shard_tab.tp_ops) == [2, 4, 8]
    m = get_model("llama-3.1-70b")
    ns, ops, ref = nearest_linear_table(mine, m.shard(4))
    assert ref.table_shape() == m.shard(4).table_shape()
    with open(raw / "linear_tp.csv", newline="") as f:
        rows = [x for x in csvlib.DictReader(f) if x["tp"] == "4" and x["op"] == "mlp_up_proj"]
    for x in rows:
        assert ops["mlp_up_proj"][ns.index(int(x["n"]))] == pytest.approx(float(x["median_us"]) * 1e-3, rel=1e-5)
    _, _, ref = nearest_linear_table(mine, m)  # tp = 1: no shard row applies
    assert ref.table_shape() != m.shard(4).table_shape()


def test_a_profile_the_table_cannot_join_is_left_as_it_was(tmp_path):
    """No linear_table beside the new entry: refused in one line (exit 2), the profile file unchanged."""
    prof = load_profile(PROFILE_DIR / "h200.json")
    raw = synthetic_raw({k: c.value for k, c in prof.coefficients.items()}, tmp_path / "raw", model="qwen-2.5-14b")
    d = json.loads((PROFILE_DIR / "h200.json").read_text())
    d.pop("linear_table")
    d.pop("more_linear_tables")
    target = tmp_path / "mine.json"
    target.write_text(json.dumps(d))
    before = target.read_bytes()
    r = _cli("calibrate", "table", str(raw), "--profile", str(target))
    assert r.returncode == 2 and "needs a linear_table" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["raw", "mine.json", "h200_qwen-2.5-14b_linear_ops.csv"])


def test_calibrate_table_on_a_profile_made_from_another_keeps_the_base_tables(tmp_path):
    """catches: a profile made from h200 (granisim profile derive) holds no more_linear_tables of its own; adding
    one wrote a list with the new table alone, and the base's tables at other shapes were no longer used."""
    prof = load_profile(PROFILE_DIR / "h200.json")
    values = {k: c.value for k, c in prof.coefficients.items()}
    raw = synthetic_raw(values, tmp_path / "raw", model="qwen-2.5-14b")
    (raw / "attention.csv").unlink()
    target = tmp_path / "mine.json"
    assert _cli("profile", "derive", "h200", "--out", str(target)).returncode == 0
    r = _cli("calibrate", "table", str(raw), "--profile", str(target))
    assert r.returncode == 0, r.stderr
    mine = load_profile(target)
    base_tables = {t.path.name for t in prof.more_linear_tables} - {"h200_qwen-2.5-14b_linear_ops.csv"}
    assert base_tables and base_tables <= {t.path.name for t in mine.more_linear_tables}
    assert any(t.path.parent == tmp_path for t in mine.more_linear_tables)  # the new one, written beside it
