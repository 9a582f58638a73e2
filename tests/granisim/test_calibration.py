"""Calibration fit (granisim.calibration): synthetic data made from known coefficients by the cost model
itself is recovered; measured corrections, host-bound censoring, M_sat, derived profiles, CLI."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from granisim.calibration.fit import KERNEL_RULES, fit, host_bound, initial_values, split_check
from granisim.calibration.msat import best_threshold, measured_crossovers
from granisim.calibration.profile import derive
from granisim.calibration.raw import (kernel_table_of, layer_model, load_raw, predict_attention, profile_of,
                                      synthetic_raw)
from granisim.cli import main
from granisim.costmodel import Correction, CostTables, step_cost
from granisim.config.hardware import PROFILE_DIR, ProfileError, get_profile, load_profile
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest

LLAMA = get_model("llama-3.1-8b")
BASE = {k: c.value for k, c in get_profile("h200").coefficients.items()}

# known coefficients (form 2) the synthetic raw data is generated from
TRUTH = initial_values(BASE, {"ceilings": {"copy_Bps": 4.5e12, "gemm_flops": 7.5e14}, "sms": 132})
TRUTH.update({
    "attn.merge.launch_s": 2.5e-6, "attn.merge.program_s": 3e-7, "attn.merge.mem_eff": 0.6,
    "attn.merge.sat_ctas_per_sm": 1.0, "attn.merge.resident_ctas_per_sm": 2,
    "kv.write_launch_s": 2e-6, "kv.write_program_s": 2e-7, "kv.write_eff": 0.5, "kv.write_sat_ctas_per_sm": 0.5,
    "kv.write_resident_ctas_per_sm": 4, "kv.copy_launch_s": 8e-6, "kv.copy_eff": 0.7,
    "attn.cascade.launch_s": 4e-6, "attn.cascade.program_s": 1.5e-6, "attn.cascade.flop_eff": 0.45,
    "attn.cascade.mem_eff": 0.85, "attn.cascade.sat_ctas_per_sm": 1.5, "attn.cascade.resident_ctas_per_sm": 1,
    "attn.dense.launch_s": 5e-6, "attn.dense.program_s": 2.5e-6, "attn.dense.flop_eff": 0.7,
    "attn.dense.mem_eff": 0.8, "attn.dense.sat_ctas_per_sm": 1.0, "attn.dense.resident_ctas_per_sm": 1,
    "attn.decode.launch_s": 3e-6, "attn.decode.program_s": 8e-7, "attn.decode.mem_eff": 0.9,
    "attn.decode.sat_ctas_per_sm": 2.0, "attn.decode.resident_ctas_per_sm": 2,
    "attn.prefill.launch_s": 5e-6, "attn.prefill.program_s": 1e-6, "attn.prefill.flop_eff": 0.4,
    "attn.prefill.mem_eff": 0.7, "attn.prefill.sat_ctas_per_sm": 2.5, "attn.prefill.resident_ctas_per_sm": 1,
    "attn.prefill.page1_eff": 0.5, "attn.prefill.page16_eff": 0.8,
    "storage.page1_eff": 0.6, "storage.page16_eff": 0.8, "overhead.step_s": 1e-4,
    **{f"linear.{f}.launch_s": 4e-6 for f in ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "lm_head")},
    **{f"linear.{f}.flop_eff": e for f, e in (("qkv_proj", 0.6), ("o_proj", 0.65), ("mlp_up", 0.75),
                                               ("mlp_down", 0.7), ("lm_head", 0.72))},
    **{f"linear.{f}.mem_eff": 0.8 for f in ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "lm_head")},
    **{f"linear.{f}.launch_s": 2e-6 for f in ("norm", "mlp_act", "rope", "add", "embedding")},
    **{f"linear.{f}.mem_eff": e for f, e in (("norm", 0.4), ("mlp_act", 0.5), ("rope", 0.45), ("add", 0.9),
                                              ("embedding", 0.2))},
})
TRUTH["attn.decode.flop_eff"] = TRUTH["attn.cascade.flop_eff"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = synthetic_raw(TRUTH, tmp_path_factory.mktemp("raw"))
    raw = load_raw(d)
    return d, raw, fit(raw, BASE, folds=1)


def test_synthetic_times_recovered(synthetic):
    """The fitted cost model reproduces held-out synthetic points (and every point) to well under 1%."""
    _, _, res = synthetic
    for fam in ("decode", "cascade", "dense", "extend", "merge", "kv_write", "kv_copy"):
        assert res.errors[fam]["formula_heldout"]["median"] < 0.005, fam
        assert res.errors[fam]["formula_heldout"]["p90"] < 0.02, fam
    for fam in ("qkv_proj", "mlp_up", "lm_head", "norm", "add"):
        assert res.errors[f"linear.{fam}"]["heldout"]["median"] < 0.01, fam


@pytest.mark.parametrize("name, rel", [
    ("hbm_bandwidth", 1e-9), ("bf16_flops", 1e-9),
    ("attn.merge.mem_eff", 0.05), ("kv.write_eff", 0.05), ("kv.copy_eff", 0.02), ("kv.copy_launch_s", 0.02),
    ("attn.cascade.flop_eff", 0.05), ("attn.cascade.launch_s", 0.1),
    ("attn.dense.flop_eff", 0.05), ("attn.dense.launch_s", 0.1),
    ("attn.decode.mem_eff", 0.05),
    ("storage.page1_eff", 0.05), ("storage.page16_eff", 0.05),
    ("attn.prefill.page1_eff", 0.05), ("attn.prefill.page16_eff", 0.05),
    ("linear.mlp_up.flop_eff", 0.02), ("linear.mlp_up.mem_eff", 0.02), ("linear.norm.mem_eff", 0.02),
])
def test_synthetic_coefficients_recovered(synthetic, name, rel):
    _, _, res = synthetic
    assert res.values[name] == pytest.approx(TRUTH[name], rel=rel)


def test_synthetic_whole_numbers_recovered(synthetic):
    _, _, res = synthetic
    for fam in ("cascade", "dense"):
        assert res.values[f"attn.{fam}.resident_ctas_per_sm"] == TRUTH[f"attn.{fam}.resident_ctas_per_sm"]


def test_recorded_splits_are_consistent():
    """Each measured decode / cascade / dense launch recorded the splits it ran, whole KV tiles as the launchers
    cut them: chunk = ceil(ceil(L / n) / block_n) tiles, n = ceil(L / chunk), programs = row tiles x KV heads
    x n, a combine launch when split. The fit prices every row with these (see the next test)."""
    a = load_raw("calibration/raw/h200").attention
    a = a[a["family"].isin(["decode", "cascade", "dense"])]
    assert len(a) > 200 and a["n_splits"].notna().all() and a["chunk"].notna().all()
    n, c, L, bn = (a[k].to_numpy(float) for k in ("n_splits", "chunk", "L", "block_n"))
    assert (c % bn == 0).all()
    assert (np.ceil(L / c) == n).all() and (np.ceil(np.ceil(L / n) / bn) * bn == c).all()
    base = np.where(a["family"] == "decode", a["n_kv"] * a["B"], np.ceil(a["M_eff"] / a["block_m"]) * a["n_kv"])
    assert (a["programs"].to_numpy(float) == base * n).all()
    assert (a["launches"].to_numpy() == np.where(n > 1, 2, 1)).all()
    most = np.where(a["family"] == "dense", KERNEL_RULES["attn.dense.max_splits"],
                    KERNEL_RULES["attn.cascade.max_splits"])
    assert ((n >= 1) & (n <= most)).all()


def test_fit_prices_the_recorded_splits():
    """The fit prices a measured launch with the splits it ran, not with today's rule. The shipped H200 run
    split as today's rules do (split_check: every recorded count); rows planted as if a launch had split
    twice as often as the rule says price with the recorded count, and only they move."""
    raw = load_raw("calibration/raw/h200")
    values = {k: c.value for k, c in get_profile("h200").coefficients.items()}
    check = split_check(raw, values, LLAMA)
    for fam in ("cascade", "decode", "dense"):
        assert check["by_family"][fam][0] == check["by_family"][fam][1] > 50
    d = raw.attention[raw.attention["family"] == "dense"].reset_index(drop=True)
    today = predict_attention(values, d.drop(columns=["n_splits", "chunk"]), LLAMA)
    assert np.allclose(predict_attention(values, d, LLAMA), today, rtol=1e-12)
    moved = (d["n_splits"] <= 4) & (np.arange(len(d)) % 2 == 0)
    planted = d.assign(n_splits=np.where(moved, 2 * d["n_splits"], d["n_splits"])).drop(columns=["chunk"])
    ran = predict_attention(values, planted, LLAMA)
    assert moved.sum() > 10 and np.allclose(ran[~moved], today[~moved], rtol=1e-12)
    # nearly every moved row prices otherwise (two split counts can fill the same waves and price alike)
    assert (np.abs(ran[moved] / today[moved] - 1) > 1e-3).mean() > 0.9


# ---- measured correction ----------------------------------------------------------------------------
def test_kernel_table_corrects_with_the_recorded_splits():
    """The measured correction is measured / formula of the launch that ran: a kernel-table row is priced with
    its recorded n_splits. The H200 row at G = 4, L = 1K, M_eff 3072 ran unsplit, as today's rule says; planted
    as a 2-split launch, the simulator prices today's launch as the formula's ratio of the two times the
    measured one, not as the measured launch (what a correction built with today's rule for that row gives)."""
    from dataclasses import replace
    from types import MappingProxyType

    prof = get_profile("h200")
    rows = prof.kernel_table.rows
    at = [i for i, (f, g, L, m) in enumerate(zip(rows["family"], rows["G"], rows["L"], rows["M_eff"]))
          if (f, g, L, m) == ("dense", 4, 1024, 3072)]
    assert len(at) == 1 and rows["n_splits"][at[0]] == 1
    two = tuple(2.0 if i == at[0] else n for i, n in enumerate(rows["n_splits"]))
    planted = replace(prof.kernel_table, rows=MappingProxyType({**rows, "n_splits": two}))
    lay = layer_model(LLAMA, 4)
    ran = float(CostTables(replace(prof, kernel_table=planted), lay).prefix_time_array("dense", 1024, 3072.0))
    today = float(CostTables(prof, lay).prefix_time_array("dense", 1024, 3072.0))
    bare = CostTables(prof, lay, use_table=False)
    assert bare.dense_split_rule(np.array([24.0 * bare.n_kv]), 1024)[0][0] == 1
    f_today = float(bare.prefix_time2("dense", 1024.0, np.array([3072.0]), 1.0)[0])
    f_ran = float(bare.prefix_time2("dense", 1024.0, np.array([3072.0]), 1.0, splits=(2.0, None))[0])
    assert ran / today == pytest.approx(f_today / f_ran, rel=0.1) and abs(f_today / f_ran - 1) > 0.1


def test_correction_exact_at_points_and_clamped():
    x = np.log2([1, 4, 16, 1, 4, 16])
    y = np.log2([256, 256, 256, 4096, 4096, 4096])
    r = np.log([1.1, 0.9, 1.2, 1.0, 1.05, 0.8])
    c = Correction(x, r, y, n=65)
    assert np.allclose(c(x, y), np.exp(r), rtol=1e-9)
    assert c(np.log2(64), np.log2(4096)) == pytest.approx(0.8)      # beyond the last column: clamped
    assert c(np.log2(2), np.log2(256)) == pytest.approx(np.exp(np.log(1.1) / 2 + np.log(0.9) / 2))
    one = Correction(np.log2([1, 8]), np.log([2.0, 1.0]))
    assert one(0.0) == pytest.approx(2.0) and one(10.0) == pytest.approx(1.0)


def test_measured_profile_reproduces_its_kernel_table():
    """The measured correction carries to kernel shapes it was not built from: a kernel table of 3 in 4 of the
    H200's measured rows predicts the 4th (held out) with the shipped coefficients to a 2.4% median error (10.5%
    at p90), against 6.9% (19.5%) without a table; in sample it is within 0.1%. (The shipped coefficients were
    fitted on every row; refitting them on the 3 in 4 gives the same held-out errors but takes a minute.)
    Planted bug: a correction that applies only at the exact shapes it was built from (Correction returning 1
    off its points) still passes the in-sample check (0.09% median) and fails here (6.9%)."""
    raw = load_raw("calibration/raw/h200")
    prof = get_profile("h200")
    v = {k: c.value for k, c in prof.coefficients.items()}
    a = raw.attention[raw.attention["family"].isin(["decode", "cascade", "dense", "merge", "kv_write"])]
    a = a.reset_index(drop=True)
    held = np.arange(len(a)) % 4 == 1
    train, test = a[~held], a[held]
    assert set(test["family"]) == set(a["family"])

    def errors(rows, table):
        pred = predict_attention(v, rows, LLAMA, table=table)
        return np.abs(pred / (rows["median_us"].to_numpy() * 1e-6) - 1)

    err = errors(test, kernel_table_of(train, LLAMA))
    bare = errors(test, None)
    assert np.median(err) < 0.035 and np.quantile(err, 0.9) < 0.13, (np.median(err), np.quantile(err, 0.9))
    assert np.median(err) < 0.5 * np.median(bare)
    own = errors(train, kernel_table_of(train, LLAMA))
    assert np.median(own) < 0.01 and np.quantile(own, 0.9) < 0.05


# ---- host-bound samples ---------------------------------------------------------------------------------
def test_host_bound_rows_censored():
    df = pd.DataFrame({"k": [1, 1, 32, 1, 2], "median_us": [13.5, 14.0, 1.2, 60.0, 10.0]})
    assert host_bound(df, 13.5).tolist() == [True, True, False, False, True]
    assert not host_bound(df, 0.0).any()


# ---- M_sat -------------------------------------------------------------------------------------------
def test_m_sat_threshold_and_crossovers():
    rows = []
    for L in (1024, 16384):
        for m, c, d in ((4, 10, 12), (64, 11, 12), (128, 20, 15), (256, 30, 20), (512, 60, 70), (1024, 100, 60)):
            rows.append(dict(L=L, M_eff=m, cascade_us=c, dense_us=d, ratio=d / c))
    p = pd.DataFrame(rows)
    per = measured_crossovers(p)
    assert per[1024] == {"strict": 1024, "first": 128, "best": 128}
    T, excess = best_threshold(p)
    assert T == 128 and excess[128] < excess[4] and excess[128] < excess[1024]


# ---- derived profiles ---------------------------------------------------------------------------------------
def test_derive_scales_rates_by_datasheet_ratios(tmp_path):
    doc = json.loads((PROFILE_DIR / "h200.json").read_text())
    h100 = derive(doc, "h100-sxm", source_name="h200")
    c0, c1 = doc["coefficients"], h100["coefficients"]
    assert c1["hbm_bandwidth"]["value"] == pytest.approx(c0["hbm_bandwidth"]["value"] * 3.35 / 4.8, rel=1e-5)
    assert c1["bf16_flops"]["value"] == pytest.approx(c0["bf16_flops"]["value"], rel=1e-5)
    assert c1["attn.dense.flop_eff"]["value"] == c0["attn.dense.flop_eff"]["value"]
    assert all(c["source"]["kind"] == "extrapolated" for c in c1.values())
    assert "kernel_table" not in h100 and "linear_table" not in h100
    p = tmp_path / "h100.json"
    p.write_text(json.dumps(h100))
    assert load_profile(p).name == "h100-sxm"


# ---- profile files and the CLI ---------------------------------------------------------------------------------
def _doc():
    return json.loads(open("granisim/config/profiles/h200.json").read())


def test_form2_profile_needs_its_coefficients(tmp_path):
    d = _doc()
    del d["coefficients"]["attn.decode.program_s"]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="attn.decode.program_s.*required when attn.form = 2"):
        load_profile(p)
    d = _doc()
    d["coefficients"]["attn.form"]["value"] = 3
    p.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="attn.form.*must be 1 or 2"):
        load_profile(p)
    d = _doc()
    d["kernel_table"]["file"] = "nope.csv"
    p.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="kernel_table.file.*nope.csv"):
        load_profile(p)


def test_profile_check_cli_one_line(tmp_path, capsys):
    d = _doc()
    d["coefficients"]["attn.dense.mem_eff"]["value"] = 1.5
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(d))
    assert main(["profile", "check", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "attn.dense.mem_eff" in err and "1.5" in err
    assert main(["profile", "check", "granisim/config/profiles/h200.json"]) == 0
    assert "valid profile 'h200'" in capsys.readouterr().out
    assert main(["profile", "show", "h200"]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "kernel_table" in out


def test_calibrate_fit_cli_writes_a_usable_profile(synthetic, tmp_path, capsys):
    d, _, _ = synthetic
    out = tmp_path / "mine.json"
    assert main(["calibrate", "fit", str(d), "--out", str(out), "--folds", "1"]) == 0
    text = capsys.readouterr().out
    assert "M_sat" in text and "decode" in text and str(out) in text
    prof = load_profile(out)
    assert prof["attn.form"] == 2 and prof.kernel_table is not None and prof.linear_table is not None
    assert {c.source.kind for c in prof.coefficients.values()} == {"measured"}
    plan = BatchPlan(step=0, policy="granikv", page_size=1, requests=(PlannedRequest(0, 300, 1, False),))
    r = step_cost(plan, prof, LLAMA)
    assert r.duration_s > 0 and math.isclose(sum(r.breakdown.values()), r.duration_s)
    assert main(["calibrate", "fit", str(tmp_path / "absent"), "--out", str(out)]) == 2


def test_calibrate_fit_cli_bad_raw_dir(tmp_path, capsys):
    (tmp_path / "meta.json").write_text("{}")
    (tmp_path / "linear.csv").write_text("a,b\n1,2\n")
    assert main(["calibrate", "fit", str(tmp_path), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "linear.csv" in err


def test_measure_smoke(tmp_path):
    """calibration.measure runs end to end on the CPU (Triton interpreter, tiny sizes)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure import main as measure

    assert measure(["--smoke", "--only", "small", "--out", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["smoke"] and "torch" in meta and not meta["errors"]
    att = pd.read_csv(tmp_path / "attention.csv")
    assert {"merge", "kv_write", "kv_copy"} <= set(att["family"]) and (att["median_us"] > 0).all()


def test_measure_extend_shapes_smoke(tmp_path):
    """The prefill-shape probe writes its own file (the fit does not read it) with every layout it names."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure import main as measure

    assert measure(["--smoke", "--only", "extend_shapes", "--out", str(tmp_path)]) == 0
    rows = pd.read_csv(tmp_path / "extend_shapes.csv")
    assert set(rows["storage"]) == {"slotrun", "shared_slotrun", "shared_slots"} and (rows["median_us"] > 0).all()
    assert not (tmp_path / "attention.csv").exists()


def test_measure_extend_ragged_smoke(tmp_path):
    """The ragged-prefill probe is opt-in, writes its own file and records each launch's chunk lengths, which
    add up to its tokens (a default run does not time it)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure import main as measure

    assert measure(["--smoke", "--only", "extend_ragged", "--out", str(tmp_path)]) == 0
    rows = pd.read_csv(tmp_path / "extend_ragged.csv", dtype={"q_lens": str})
    lens = [tuple(map(int, q.split(";"))) for q in rows["q_lens"]]
    assert lens == [(40,), (20, 20), (30, 10), (10, 30)]
    assert list(rows["T"]) == [sum(q) for q in lens] and list(rows["n_req"]) == [len(q) for q in lens]
    assert (rows["median_us"] > 0).all() and not (tmp_path / "attention.csv").exists()


def test_pool_layouts_of_the_shape_probe():
    """'slotrun': each sequence a contiguous run; 'shared_*': every sequence lists the same slots."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure.common import Pool

    pool = Pool(4096, 2, 8, torch.float32)
    run = pool.layout("slotrun", 3, 50)
    ids = run.indices.view(3, 50)
    assert (ids.diff(dim=1) == 1).all() and (ids[1:, 0] == ids[:-1, -1] + 1).all()
    for st in ("shared_slotrun", "shared_slots"):
        lay = pool.layout(st, 3, 50)
        ids = lay.indices.view(3, 50)
        assert (ids == ids[0]).all() and (lay.indptr.tolist() == [0, 50, 100, 150])
    assert (pool.layout("shared_slotrun", 2, 50).indices[:50].diff() == 1).all()


def test_measure_extend_order_smoke(tmp_path, capsys):
    """The grid-order probe is opt-in and times every point under every start order, one row each, side by
    side in its printed table."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure import main as measure
    from gpu_backend.kernels.extend import ORDERS

    assert measure(["--smoke", "--only", "extend_order", "--out", str(tmp_path)]) == 0
    rows = pd.read_csv(tmp_path / "extend_order.csv", dtype={"q_lens": str})
    points = [(0, "40"), (30, "10;30")]
    assert list(zip(rows["L"], rows["q_lens"], rows["order"])) == [(c, q, o) for c, q in points for o in ORDERS]
    assert (rows["median_us"] > 0).all() and not (tmp_path / "extend_ragged.csv").exists()
    header, table = capsys.readouterr().out.split("in_order us")
    assert table.split("\n")[0].split() == ["heavy_first", "blocks_major"]
    lines = table.split("\n")[1:1 + len(points)]
    assert [ln.split()[:2] for ln in lines] == [[str(c), q] for c, q in points]
    assert all(float(x) > 0 for ln in lines for x in ln.split()[3:5])


def test_shared_decode_layouts_share_a_roles_prefix():
    """Request b reads role (b mod k)'s prefix and suffix tokens of its own; 'decode_distinct' shares nothing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure.common import Pool
    from calibration.measure.shared_decode import shared_layout

    pool = Pool(1 << 16, 2, 8, torch.float32)
    for st, per in (("slots", 48 + 16), ("slots_random", 48 + 16), ("pages16", (48 + 16) // 16)):
        lay = shared_layout(pool, st, 5, 2, 48, 16, shared=True)
        rows = lay.indices.view(5, per)
        pre = rows[:, : per - (1 if st == "pages16" else 16)]
        assert (pre[2] == pre[0]).all() and (pre[4] == pre[0]).all() and (pre[3] == pre[1]).all()
        assert not (pre[1] == pre[0]).all() and not (rows[2, -1:] == rows[0, -1:]).all()
        if st == "slots":
            assert (pre[0].diff() == 1).all()
        distinct = shared_layout(pool, st, 5, 2, 48, 16, shared=False).indices.view(5, per)
        assert not (distinct[2, :3] == distinct[0, :3]).all()
        if st == "pages16":
            assert lay.lens.tolist() == [64] * 5


def test_measure_shared_decode_smoke(tmp_path):
    """The opt-in section times each point shared and distinct, one row each."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure import main as measure

    assert measure(["--smoke", "--only", "shared_decode", "--out", str(tmp_path)]) == 0
    rows = pd.read_csv(tmp_path / "shared_decode.csv")
    assert list(rows["family"][:2]) == ["decode_shared", "decode_distinct"] and (rows["median_us"] > 0).all()
    first = rows.iloc[0]
    assert first["distinct_tokens"] == first["roles"] * first["L"] + first["B"] * first["suffix"]
    assert set(rows["storage"]) == {"slots", "pages16"} and not (tmp_path / "attention.csv").exists()


def test_measure_decode_buckets_smoke(tmp_path):
    """The opt-in section times decode at off-grid batch buckets (attention.csv rows) and padded launches."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure import main as measure

    assert measure(["--smoke", "--only", "decode_buckets", "--out", str(tmp_path)]) == 0
    full = pd.read_csv(tmp_path / "attention.csv")
    assert set(full["family"]) == {"decode"} and set(full["B"]) == {3, 6} and (full["median_us"] > 0).all()
    padded = pd.read_csv(tmp_path / "decode_padded.csv")
    assert list(zip(padded["rows"], padded["n_real"])) == [(6, 5)] * 2 and (padded["median_us"] > 0).all()


def test_padded_decode_layouts_end_in_empty_sequences():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from calibration.measure.attention import _padded
    from calibration.measure.common import Pool

    pool = Pool(4096, 2, 8, torch.float32)
    for st in ("slots", "pages16", "slab"):
        lay = _padded(pool.layout(st, 3, 32), 3, 5)
        if st == "slab":
            assert lay.length.tolist() == [32, 32, 32, 0, 0]
        elif st == "pages16":
            assert lay.indptr.tolist() == [0, 2, 4, 6, 6, 6] and lay.lens.tolist() == [32, 32, 32, 0, 0]
        else:
            assert lay.indptr.tolist() == [0, 32, 64, 96, 96, 96]


def test_profile_scripts_take_help_and_refuse_a_missing_path(tmp_path, capsys):
    """catches: docs/tp.md names `python -m granisim.calibration.collectives` and `.shipped`, which rewrite the
    shipped profiles; `--help` was read as a profile file or raw folder (a FileNotFoundError traceback), and a
    missing path was a traceback too. Now --help prints the usage, a missing path is one line, exit 2, before
    anything is written; a profile file given is extended in place."""
    import shutil

    from granisim.calibration import collectives, shipped

    for entry in (collectives.main, shipped.cli):
        with pytest.raises(SystemExit) as stop:
            entry(["--help"])
        assert stop.value.code == 0 and "usage:" in capsys.readouterr().out
    assert collectives.main([str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'none.json'}: no such profile file\n"
    assert shipped.cli([str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'none'}: no such raw run folder\n"
    copy = tmp_path / "h200.json"
    shutil.copyfile(PROFILE_DIR / "h200.json", copy)
    assert collectives.main([str(copy)]) == 0
    assert "comm.allreduce.tp2.busbw" in json.loads(copy.read_text())["coefficients"]
    # a profile made from another inherits its base's: refused in one line, the file untouched
    made = tmp_path / "steps.json"
    shutil.copyfile(PROFILE_DIR / "h200-engine-steps.json", made)
    assert collectives.main([str(made)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "made from h200-engine" in err
    assert made.read_bytes() == (PROFILE_DIR / "h200-engine-steps.json").read_bytes()
