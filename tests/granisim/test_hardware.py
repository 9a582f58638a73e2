"""Hardware profiles: shipped files load, every coefficient has a valid source, bad files give
one-line errors naming file, field and value."""

import copy
import json
from pathlib import Path

import pytest

from granisim.config.hardware import (COEFFICIENTS, OPTIONAL_COEFFICIENTS, PROFILE_DIR, HardwareProfile, ProfileError,
                               available_profiles, get_profile, load_profile)

SHIPPED = ["a100-80gb", "h100-sxm", "h200", "b200"]
GIB = 2**30


def test_shipped_profiles_present_and_load():
    assert set(SHIPPED) <= set(available_profiles())
    for name in SHIPPED:
        p = get_profile(name)
        assert isinstance(p, HardwareProfile) and p.name == name
        assert set(COEFFICIENTS) <= set(p.coefficients) <= set(COEFFICIENTS) | set(OPTIONAL_COEFFICIENTS)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_coefficient_has_a_valid_source(name):
    raw = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    for key, c in get_profile(name).coefficients.items():
        s = c.source
        assert s.kind in ("measured", "published", "extrapolated"), key
        if s.kind == "measured":
            assert s.date and s.command, key
        elif s.kind == "published":
            assert s.citation and len(s.citation) > 10, key
        else:
            assert s.from_ and s.how and len(s.how) > 10, key
        assert raw["coefficients"][key]["unit"] == {**COEFFICIENTS, **OPTIONAL_COEFFICIENTS}[key][0]
    if get_profile(name).linear_table is not None:
        assert get_profile(name).linear_table.source.kind in ("measured", "published")
    if get_profile(name).kernel_table is not None:
        assert get_profile(name).kernel_table.source.kind == "measured"


@pytest.mark.parametrize("name,base", [("h200-engine", "h200"), ("h100-engine", "h100-sxm")])
def test_engine_profiles_stand_on_their_gpus_measured_profile(name, base):
    """An engine profile is its GPU's measured profile plus the engine's corrections, each with its source."""
    raw = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    p, b = get_profile(name), get_profile(base)
    assert raw["base"]["profile"] == base and p.gpu == b.gpu
    assert raw["coefficients"] and all(k.startswith(("engine.", "overhead.", "attn.", "host."))
                                       for k in raw["coefficients"])
    for key in raw["coefficients"]:
        s = p.coefficients[key].source
        assert (s.kind == "measured" and s.date and s.command) or (s.kind == "extrapolated" and s.from_ and s.how), key
    assert p.bf16_flops == b.bf16_flops and p.linear_table == b.linear_table  # the base's measurements, unchanged


def test_datasheet_values():
    """a100: datasheet; h200: measured (the calibration run); h100-sxm, b200: the measured h200 scaled by
    datasheet ratios (python -m granisim.calibration.shipped)."""
    a, h1, h2, b = (get_profile(n) for n in SHIPPED)
    assert (a.hbm_bandwidth, a.bf16_flops, a.sm_count, a.memory_bytes) == (2.039e12, 312e12, 108, 80 * GIB)
    for p in (a,):
        for k in ("hbm_bandwidth", "bf16_flops", "sm_count", "memory_bytes"):
            assert p.coefficients[k].source.kind == "published"
    assert h2.sm_count == 132 and 4.0e12 < h2.hbm_bandwidth < 4.8e12 and 6e14 < h2.bf16_flops < 9.9e14
    assert 139 * GIB < h2.memory_bytes < 141 * GIB
    # measured on an H100 SXM (datasheet 3.35 TB/s, 989 TFLOP/s dense bf16, 80 GB)
    assert h1.sm_count == 132 and 2.8e12 < h1.hbm_bandwidth < 3.35e12 and 6e14 < h1.bf16_flops < 9.9e14
    assert 79 * GIB < h1.memory_bytes <= 80 * GIB
    assert b.hbm_bandwidth == pytest.approx(h2.hbm_bandwidth * 8 / 4.8, rel=1e-5)
    assert b.bf16_flops == pytest.approx(h2.bf16_flops * 2250 / 989, rel=1e-5)
    assert (b.sm_count, b.memory_bytes) == (148, 180 * GIB)


def test_m_sat_sources():
    a = get_profile("a100-80gb")
    assert a.m_sat == 1024 and a.coefficients["m_sat"].source.kind == "published"
    assert "2608.15584" in a.coefficients["m_sat"].source.citation
    h2 = get_profile("h200")
    assert h2.coefficients["m_sat"].source.kind == "measured" and 16 <= h2.m_sat <= 1024
    assert get_profile("h100-sxm").coefficients["m_sat"].source.kind == "measured"
    c = get_profile("b200").coefficients["m_sat"]
    assert c.source.kind == "extrapolated" and "h200" in c.source.from_
    # scaled by the ridge (tensor-core rate / bandwidth) ratio relative to H200
    assert c.value == round(h2.m_sat * (2250 / 8.0) / (989 / 4.8))


def test_measured_and_derived_sources():
    from granisim.config.coefficients import PARALLEL_COEFFICIENTS

    # measured on one GPU each (the H200's MoE grouped GEMMs too), except the tp all-reduce curve (it needs several
    # GPUs), M_sat per tp, the H100's grouped GEMMs and the host link (measured on neither; its copy/compute
    # overlap measured on an H100 only: calibration/raw/h100/copy_overlap)
    grouped = {k for k in PARALLEL_COEFFICIENTS if k.startswith("linear.moe_")}
    link = {"host.copy_launch_s", "host.link_bandwidth", "host.page_copy_s"}
    for n, gpu, unmeasured in (("h200", "H200", (set(PARALLEL_COEFFICIENTS) - grouped) | {"host.overlap"}),
                               ("h100-sxm", "H100", set(PARALLEL_COEFFICIENTS) | link)):
        p = get_profile(n)
        assert {c.source.kind for k, c in p.coefficients.items() if k not in unmeasured} == {"measured"}, n
        assert {p.coefficients[k].source.kind for k in unmeasured if k in p.coefficients} <= {"extrapolated"}, n
        assert p["attn.form"] == 2
        assert p.linear_table is not None and p.linear_table.source.kind == "measured"
        assert p.kernel_table is not None and len(p.kernel_table.rows["family"]) > 100
        for k, c in p.coefficients.items():
            if k in unmeasured:
                continue
            e = c.source.extra
            assert c.source.date and c.source.command and gpu in e["gpu"] and e["commit"] and "triton" in e["versions"]
    h2 = get_profile("h200")
    assert grouped and all(h2.coefficients[k].source.kind == "measured" for k in grouped)
    assert h2.coefficients["host.overlap"].source.kind == "extrapolated"
    assert get_profile("h100-sxm").coefficients["host.overlap"].source.kind == "measured"
    b = get_profile("b200")  # derived from h200 by datasheet ratios
    assert b.linear_table is None and b.kernel_table is None
    assert {c.source.kind for c in b.coefficients.values()} == {"extrapolated"}


def test_a100_linear_table():
    t = get_profile("a100-80gb").linear_table
    assert t is not None and t.path.name == "vidur_a100_llama3_8b_linear_ops.csv"
    assert t.num_tokens[0] == 1 and t.num_tokens[-1] == 32768
    assert list(t.num_tokens) == sorted(set(t.num_tokens))
    assert t.ops_ms["mlp_up_proj"][0] == pytest.approx(0.142)
    assert t.source.kind == "published" and "vidur" in t.source.citation


def test_get_profile_by_path_and_cache(tmp_path):
    assert get_profile("a100-80gb") is get_profile("a100-80gb")
    assert get_profile(PROFILE_DIR / "h200.json") is get_profile("h200")
    dst = tmp_path / "mine.json"
    dst.write_text((PROFILE_DIR / "h200.json").read_text())
    assert get_profile(str(dst)).name == "h200"
    with pytest.raises(ProfileError, match="unknown profile.*a100-80gb"):
        get_profile("v100")
    assert issubclass(ProfileError, ValueError)


def test_describe_lists_sources():
    text = get_profile("a100-80gb").describe()
    assert "published" in text and "extrapolated" in text and "hbm_bandwidth" in text


# ---- bad files ----------------------------------------------------------------------------------
BASE = json.loads((PROFILE_DIR / "h200.json").read_text())


def _write(tmp_path: Path, doc) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def _err(tmp_path, doc) -> str:
    p = _write(tmp_path, doc)
    with pytest.raises(ProfileError) as e:
        load_profile(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def _with(mut):
    d = copy.deepcopy(BASE)
    mut(d)
    return d


@pytest.mark.parametrize("mut, field, value", [
    (lambda d: d["coefficients"]["attn.dense.m_tile"].update(value=-3), "coefficients.attn.dense.m_tile.value", "-3"),
    (lambda d: d["coefficients"]["attn.dense.m_tile"].update(value=12.5), "coefficients.attn.dense.m_tile.value", "12.5"),
    (lambda d: d["coefficients"]["attn.decode.mem_eff"].update(value=1.7), "coefficients.attn.decode.mem_eff.value", "1.7"),
    (lambda d: d["coefficients"]["hbm_bandwidth"].update(value="fast"), "coefficients.hbm_bandwidth.value", "fast"),
    (lambda d: d["coefficients"].update({"host.overlap": {**d["coefficients"]["m_sat"], "unit": "", "value": -0.1}}),
     "coefficients.host.overlap.value", "-0.1"),
    (lambda d: d["coefficients"].pop("sm_count"), "coefficients.sm_count", "missing"),
    (lambda d: d["coefficients"].update(typo_eff={"value": 1, "unit": "", "source": BASE["coefficients"]["m_sat"]["source"]}),
     "coefficients.typo_eff", "typo_eff"),
    (lambda d: d["coefficients"]["sm_count"]["source"].update(kind="guessed"), "coefficients.sm_count.source", "guessed"),
    (lambda d: d["coefficients"]["sm_count"].update(source={"kind": "published"}),
     "coefficients.sm_count.source.citation", "missing"),
    (lambda d: d["coefficients"]["m_sat"].update(source={"kind": "extrapolated", "from": "a100"}),
     "coefficients.m_sat.source.how", "missing"),
    (lambda d: d["coefficients"]["m_sat"].update(source={"kind": "measured", "command": "x"}),
     "coefficients.m_sat.source.date", "missing"),
    (lambda d: d["coefficients"]["hbm_bandwidth"].update(unit="GB/s"), "coefficients.hbm_bandwidth.unit", "GB/s"),
    (lambda d: d.update(schema="v0"), "schema", "v0"),
    (lambda d: d.update(color="red"), "color", "red"),
    (lambda d: d.update(linear_table={"file": "nope.csv", "model": {}, "scaling": "x",
                                      "source": {"kind": "published", "citation": "c"}}),
     "linear_table.model.hidden", "missing"),
])
def test_bad_profile_names_file_field_value(tmp_path, mut, field, value):
    msg = _err(tmp_path, _with(mut))
    assert f"field {field}" in msg and value in msg


def test_bad_table_file(tmp_path):
    model = dict(hidden=1, n_q_heads=1, n_kv_heads=1, head_dim=1, intermediate=1, vocab=1, dtype_bytes=2)
    msg = _err(tmp_path, _with(lambda d: d.update(linear_table={
        "file": "nope.csv", "model": model, "scaling": "x", "source": {"kind": "published", "citation": "c"}})))
    assert "linear_table.file" in msg and "nope.csv" in msg


def test_unreadable_files(tmp_path):
    msg = _err(tmp_path, "{not json")
    assert "invalid JSON" in msg
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "absent.json")


def test_a_table_shape_with_an_unknown_dtype_width_names_the_field(tmp_path):
    """A linear table measured at dtype_bytes = 3 names no dtype: one line with the field and the value."""
    d = json.loads((PROFILE_DIR / "a100-80gb.json").read_text())
    d["linear_table"]["model"]["dtype_bytes"] = 3
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(d))  # its table file is found in granisim/config/data
    with pytest.raises(ProfileError, match=r"linear_table\.model\.dtype_bytes: value 3: must be one of \[1, 2, 4\]"):
        load_profile(p)


def test_measured_shape_round_trips_a_model_and_shards_like_it():
    from granisim.config.models import get_model, measured_shape

    m = get_model("llama-3.1-70b")
    s = measured_shape(m.table_shape())
    assert s.table_shape() == m.table_shape() and s.num_layers == 1
    assert s.shard(4).table_shape() == m.shard(4).table_shape()
    assert s.shard(8).vocab_per_gpu == m.shard(8).vocab_per_gpu == -(-m.vocab // 8)


def test_profile_list_names_every_shipped_profile_and_what_it_is(capsys):
    """`granisim profile list`: a line per shipped profile with its GPU, its base, its sources by kind, whether it
    holds engine corrections and which models its step classes cover; a name with `list`, or none with another
    action, is one line and exit 2."""
    from granisim.cli import main

    assert main(["profile", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert lines[0].split()[0] == "profile" and sorted(rows) == available_profiles()
    assert "h100-sxm" in rows["h100-engine"] and "yes" in rows["h100-engine"]
    assert rows["h100-engine-steps"].endswith("llama-3.1-8b, qwen-2.5-14b")
    assert rows["h200-engine-steps"].endswith("llama-3.1-8b") and rows["h200"].rstrip().endswith("-")
    assert "published" in rows["a100-80gb"] and "measured" not in rows["a100-80gb"]
    for argv, msg in ((["profile", "list", "h200"], "takes no profile name"),
                      (["profile", "show"], "give a profile name or JSON file")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err


def test_a_profile_written_wrong_is_named_as_itself_not_as_its_scratch_file(tmp_path):
    """catches: `calibrate reread --profile p.json` on a file without a schema named '.p.json.new'."""
    from granisim.config.hardware import write_checked

    path = tmp_path / "p.json"
    with pytest.raises(ProfileError) as err:
        write_checked(path, {"name": "x"})
    assert str(err.value).startswith(f"{path}: field schema") and ".new" not in str(err.value)
    assert not path.exists() and not list(tmp_path.iterdir())
