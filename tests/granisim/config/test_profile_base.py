"""A profile made from another (``base``): it loads as its base with its own fields on top, from any folder;
a base that changed since or is unknown is refused in one line naming file, field and value."""

import json
import shutil
from pathlib import Path

import pytest

from granisim.cli import main
from granisim.config.hardware import PROFILE_DIR, ProfileError, available_profiles, get_profile, load_profile
from granisim.config.profile_base import derived, digest


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _made_from(base: str, out: Path, **coefficients) -> Path:
    doc = derived(base, out, PROFILE_DIR, name=out.stem, notes="test")
    if coefficients:
        src = {"kind": "extrapolated", "from": "a test", "how": "set by hand to check the merge"}
        doc["coefficients"] = {k: {"value": v, "unit": get_profile(base).coefficients[k].unit, "source": src}
                               for k, v in coefficients.items()}
    return _write(out, doc)


def test_a_profile_elsewhere_is_its_base_with_its_own_values_on_top(tmp_path):
    p = load_profile(_made_from("h200", tmp_path / "mine.json", hbm_bandwidth=4.0e12))
    base = get_profile("h200")
    assert p.name == "mine" and p.gpu == base.gpu and p.base == "h200" and "made from h200" in p.describe()
    assert p["hbm_bandwidth"] == 4.0e12 and p.coefficients["hbm_bandwidth"].source.kind == "extrapolated"
    assert {k: c for k, c in p.coefficients.items() if k != "hbm_bandwidth"} == \
        {k: c for k, c in base.coefficients.items() if k != "hbm_bandwidth"}
    # the base's tables are found although they lie beside the base, not beside this file
    assert p.linear_table == base.linear_table and p.kernel_table == base.kernel_table


def test_bases_chain_and_a_path_base_is_relative_to_the_file(tmp_path):
    (tmp_path / "sub").mkdir()
    first = _made_from("h200", tmp_path / "first.json", hbm_bandwidth=4.0e12)
    # a table that lies only beside `first`, under a name no shipped folder holds
    doc = json.loads(first.read_text())
    table = json.loads((PROFILE_DIR / "h200.json").read_text())["linear_table"]
    shutil.copyfile(get_profile("h200").linear_table.path, tmp_path / "my_linear.csv")
    doc["linear_table"] = {**table, "file": "my_linear.csv"}
    _write(first, doc)
    second = _made_from(str(first), tmp_path / "sub" / "second.json", bf16_flops=9.0e14)
    assert json.loads(second.read_text())["base"]["profile"] == "../first.json"
    p = load_profile(second)
    assert p["hbm_bandwidth"] == 4.0e12 and p["bf16_flops"] == 9.0e14
    assert p.linear_table.path == (tmp_path / "my_linear.csv").resolve()


def _one_line(path: Path) -> str:
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_base_changed_since_is_refused(tmp_path):
    base = _made_from("h200", tmp_path / "base.json")
    child = _made_from(str(base), tmp_path / "child.json")
    load_profile(child)
    doc = json.loads(base.read_text())
    doc["notes"] = "changed"
    _write(base, doc)
    msg = _one_line(child)
    assert f"{child}: field base.sha256" in msg and "base.json has changed since" in msg and digest(base) in msg


@pytest.mark.parametrize("base, field, says", [
    ("h200-engine", "base", "must be {"),
    ({"profile": "nope", "sha256": "0" * 16}, "base.profile", "no such profile"),
    ({"profile": "h200", "sha256": "0" * 16}, "base.sha256", "has changed since"),
    ({"profile": "h200"}, "base", "must be {"),
    ("coefficients", "coefficients", "valid dictionary"),  # the base is fine, this file's coefficients are not
])
def test_bad_base_names_file_field_value(tmp_path, base, field, says):
    doc = {"schema": "granikv-hardware-profile/1", "name": "p", "base": base}
    if base == "coefficients":
        doc.update(base={"profile": "h200", "sha256": digest(PROFILE_DIR / "h200.json")}, coefficients=[1])
    path = _write(tmp_path / "p.json", doc)
    msg = _one_line(path)
    assert msg.startswith(f"{path}: field {field}: value ") and says in msg


def test_the_cli_says_a_bad_base_in_one_line_and_exits_2(tmp_path, capsys):
    path = _write(tmp_path / "p.json", {"schema": "granikv-hardware-profile/1", "name": "p",
                                        "base": {"profile": "nope", "sha256": "0" * 16}})
    assert main(["profile", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "field base.profile" in err


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_loads_with_its_base_as_it_is(name):
    """A shipped profile made from another was made from the base as shipped (its digest matches)."""
    raw = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    if "base" in raw:
        assert raw["base"]["sha256"] == digest(PROFILE_DIR / f"{raw['base']['profile']}.json")
    get_profile(name)


def test_derive_writes_a_profile_made_from_a_shipped_one(tmp_path, capsys):
    out = tmp_path / "profiles" / "mine.json"  # its folder is made, as calibrate fit does
    assert main(["profile", "derive", "h200", "--out", str(out)]) == 0
    p, base = load_profile(out), get_profile("h200")
    assert p.base == "h200" and dict(p.coefficients) == dict(base.coefficients)
    doc = json.loads(out.read_text())
    doc["coefficients"] = {"hbm_bandwidth": {"value": 5e12, "unit": "B/s", "source": {
        "kind": "extrapolated", "from": "h200", "how": "a what-if: a faster memory"}}}
    _write(out, doc)
    assert load_profile(out)["hbm_bandwidth"] == 5e12


@pytest.mark.parametrize("args, says", [
    (["derive", "h200", "--out", "EXISTS.json"], "already exists"),
    (["derive", "nope", "--out", "p.json"], "unknown profile"),
    (["derive", "h200", "--out", "p.txt"], "a profile is a .json file"),
    # was `EXISTS.json/p.json: Not a directory`, without --out
    (["derive", "h200", "--out", "EXISTS.json/p.json"], "--out EXISTS.json/p.json: EXISTS.json is a file"),
    (["derive", "h200"], "--out FILE.json goes with derive and carry"),
    (["show", "h200", "--out", "p.json"], "--out FILE.json goes with derive and carry"),
])
def test_derive_refuses_in_one_line(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "EXISTS.json").write_text("mine")
    assert main(["profile", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err
    assert (tmp_path / "EXISTS.json").read_text() == "mine" and not (tmp_path / "p.json").exists()


def test_measured_coefficients_written_into_a_profile_made_from_another(tmp_path):
    """catches: the writers of measured coefficients (all-reduce, grouped GEMMs) read the file's own
    ``coefficients``, which a profile made from another may not have (a KeyError); they add them as its own."""
    from calibration.measure.allreduce import write_profile
    from granisim.calibration.moe_fit import write

    out = tmp_path / "mine.json"
    shutil.copyfile(PROFILE_DIR / "h200-engine-steps.json", out)  # its step classes and nothing else
    assert "coefficients" not in json.loads(out.read_text())
    src = {"kind": "measured", "date": "2026-12-06", "command": "a test"}
    write_profile(out, {2: {"latency_s": 7e-6, "busbw": 3e11, "sizes": 9, "held_out_median": 0.01,
                            "held_out_max": 0.02}}, src)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "meta.json").write_text(json.dumps({"date": "2026-12-06", "command": "a test"}))
    key = "linear.moe_up.launch_s"
    write(out, tmp_path / "raw", {key: 9e-6})
    p = load_profile(out)
    assert p["comm.allreduce.tp2.busbw"] == 3e11 and p[key] == 9e-6 and p.base == "h200-engine"
