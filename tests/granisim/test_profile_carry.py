"""`granisim profile carry`: an engine profile's corrections written on another GPU's microbenchmark profile; the
re-read of a shared prefix split into the decode kernel's own share (measured per GPU, `granisim calibrate reread`)
and the engine's excess over it (carried) (granisim/calibration/carry.py, reread.py)."""

import dataclasses
import json

import pandas as pd
import pytest

from granisim.calibration.carry import KERNEL, REREAD, carry, l2_ratio
from granisim.calibration.engine_fit import with_engine
from granisim.calibration.reread import kernel_share, reread_share
from granisim.cli import main
from granisim.config.hardware import PROFILE_DIR, Source, get_profile, load_profile
from granisim.config.models import get_model
from granisim.config.profile_base import digest
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup
from granisim.costmodel import step_cost

LLAMA = get_model("llama-3.1-8b")
H200, H100 = get_profile("h200"), get_profile("h100-sxm")


def _without_kernel_share(p):
    return dataclasses.replace(p, coefficients={k: c for k, c in p.coefficients.items() if k != KERNEL})


def _reread_seconds(profile, share: float, storage: str, policy: str, page_size: int) -> float:
    """What 31 members re-reading one 16K prefix at ``share`` add to a decode step's attention (linear in it)."""
    reqs = tuple(PlannedRequest(rid=i, context_len=16384 + 50 + i, num_new=1, is_prefill=False, group=0,
                                shared_len=16384) for i in range(32))
    g = PrefixGroup(key=7, prefix_len=16384, storage=storage, path="paged", members=tuple(range(32)), m_eff=128)
    plan = BatchPlan(step=0, policy=policy, page_size=page_size, requests=reqs, groups=(g,))
    full = with_engine(profile, {REREAD: share}, Source("measured"))
    half = with_engine(profile, {REREAD: share / 2}, Source("measured"))
    return 2 * (step_cost(plan, full, LLAMA).breakdown["attn_decode"]
                - step_cost(plan, half, LLAMA).breakdown["attn_decode"])


def _carried(tmp_path, onto="h100-sxm"):
    out = tmp_path / "carried.json"
    assert main(["profile", "carry", "h200-engine", "--onto", onto, "--out", str(out)]) == 0
    return out


def test_carry_keeps_the_corrections_and_the_engines_excess_over_the_kernels_reread(tmp_path):
    """The H200 engine's re-read share (0.85) is its kernel's measured 0.60 plus 0.25 in situ; on the H100, whose
    kernel measured 0.40, the carried share is 0.65. Planted bugs: the share carried unchanged (0.85), or scaled
    whole as if all of it were served from L2 (0.60)."""
    out = _carried(tmp_path)
    old, new = get_profile("h200-engine"), load_profile(out)
    doc = json.loads(out.read_text())
    assert doc["base"] == {"profile": "h100-sxm", "sha256": digest(PROFILE_DIR / "h100-sxm.json")}
    own = json.loads((PROFILE_DIR / "h200-engine.json").read_text())["coefficients"]
    assert set(doc["coefficients"]) == set(own)
    for name, c in doc["coefficients"].items():
        assert c["source"]["kind"] == "extrapolated" and "h200-engine" in c["source"]["from"]
        if name != REREAD:
            assert new[name] == old[name]  # every correction and host term as fitted
    assert new["hbm_bandwidth"] == H100["hbm_bandwidth"]  # the rates are the new GPU's
    assert new[KERNEL] == H100[KERNEL] < H200[KERNEL] == old[KERNEL]  # each GPU's own measurement
    assert new[REREAD] - new[KERNEL] == pytest.approx(old[REREAD] - old[KERNEL])
    assert 0.62 < new[REREAD] < 0.68


def test_an_unmeasured_kernel_share_keeps_its_l2_time_per_byte():
    """Without a measured kernel share on the new GPU, the kernel's part keeps its seconds per byte (L2) and the
    excess its share: on an H100 (0.70x the H200's decode stream, the same SMs) 0.60 x 0.70 + 0.25. The cost model
    prices the kernel's part at the scaled share in the H200's time (within the storages' efficiencies). Planted
    bug: the ratio inverted prices it 2x."""
    h100 = _without_kernel_share(H100)
    got = carry({REREAD: {"value": 0.85, "unit": "", "source": {"kind": "measured"}}}, "e", H200, h100)[REREAD]
    r = l2_ratio(H200, h100)
    assert 0.69 < r < 0.72
    assert got["value"] == pytest.approx(H200[KERNEL] * r + (0.85 - H200[KERNEL]))
    assert "time per byte kept" in got["source"]["how"]
    for storage, policy, page in (("token", "token", 1), ("paged", "paged16", 16)):
        was = _reread_seconds(H200, H200[KERNEL], storage, policy, page)
        now = _reread_seconds(h100, H200[KERNEL] * r, storage, policy, page)
        assert now / was == pytest.approx(1.0, abs=0.06), (storage, now / was)


def test_without_any_kernel_share_the_whole_share_is_taken_as_the_kernels():
    h200, b200 = _without_kernel_share(H200), get_profile("b200")  # b200, derived, measures none either
    got = carry({REREAD: {"value": 0.5, "unit": "", "source": {"kind": "measured"}}}, "e", h200, H100)[REREAD]
    assert got["value"] == pytest.approx(H100[KERNEL])  # 0.5 all kernel, replaced by the H100's measured share
    got = carry({REREAD: {"value": 0.5, "unit": "", "source": {"kind": "measured"}}}, "e", h200, b200)[REREAD]
    assert got["value"] == pytest.approx(min(1.0, 0.5 * l2_ratio(h200, b200)))


def test_a_share_that_would_exceed_one_is_held_at_one():
    """A GPU whose decode stream outruns its L2 (by the ratio) re-reads at no more than a first read costs."""
    coefs = {REREAD: {"value": 0.95, "unit": "", "source": {"kind": "measured", "date": "d", "command": "c"}}}
    got = carry(coefs, "h200-engine", H200, get_profile("b200"))[REREAD]
    assert got["value"] == 1.0 and "at most 1" in got["source"]["how"]


def test_carry_onto_its_own_base_changes_no_price(tmp_path):
    """Carried onto the GPU it was fitted on, the profile prices as the engine profile (the values, not the
    sources, are the same)."""
    new, old = load_profile(_carried(tmp_path, onto="h200")), get_profile("h200-engine")
    assert {k: c.value for k, c in new.coefficients.items()} == {k: c.value for k, c in old.coefficients.items()}


@pytest.mark.parametrize("args, says", [
    (["carry", "h200", "--onto", "h100-sxm", "--out", "p.json"], "field base: value None"),
    (["carry", "h200-engine-steps", "--onto", "h100-sxm", "--out", "p.json"], "field step_classes"),
    (["carry", "h200-engine", "--onto", "nope", "--out", "p.json"], "unknown profile"),
    # catches: corrections carried onto a profile holding its own (exit 0; step factors priced against another base)
    (["carry", "h200-engine", "--onto", "h100-engine-steps", "--out", "p.json"], "--onto h100-engine-steps: holds"),
    (["carry", "h200-engine", "--onto", "h100-engine", "--out", "p.json"], "--onto h100-engine: holds"),
    (["carry", "h200-engine", "--out", "p.json"], "--onto goes with carry"),
    (["carry", "h200-engine", "--onto", "h100-sxm"], "--out FILE.json goes with derive and carry"),
    (["carry", "h200-engine", "--onto", "h100-sxm", "--out", "EXISTS.json"], "already exists"),
    (["show", "h200", "--onto", "h100-sxm"], "--onto goes with carry"),
])
def test_carry_refuses_in_one_line(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "EXISTS.json").write_text("mine")
    assert main(["profile", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert (tmp_path / "EXISTS.json").read_text() == "mine" and not (tmp_path / "p.json").exists()


# ---- the kernel's share, measured ---------------------------------------------------------------------------
def _shared_decode(folder, f: float, points=((16384, 4, 64), (4096, 1, 8), (4096, 4, 4))):
    """A shared_decode run whose shared launches stream B s + k L + f (B - k) L tokens at the distinct rate."""
    rows = []
    for L, k, B in points:
        s, us_per_token = 512, 1e-3
        distinct = B * (L + s) * us_per_token
        shared = (B * s + k * L + f * max(B - k, 0) * L) * us_per_token
        for fam, t in (("decode_shared", shared), ("decode_distinct", distinct)):
            rows.append(dict(family=fam, storage="slots", G=4, n_q=32, n_kv=8, d=128, B=B, roles=k, L=L, suffix=s,
                             median_us=t))
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "shared_decode.csv", index=False)
    (folder / "meta.json").write_text(json.dumps({"date": "2026-12-07", "command": "a test", "gpu": "G"}))
    return folder


def test_the_kernels_share_is_read_back_from_its_launch_times(tmp_path):
    """Planted bug: the prefix counted once per request in the shared launch (k L read as B L) gives 0 for f."""
    raw = _shared_decode(tmp_path / "raw", 0.4)
    share = reread_share(raw)
    assert share.f.dropna().to_numpy() == pytest.approx([0.4, 0.4])  # B = k: no re-read, NaN
    assert share.f.isna().sum() == 1
    entry = kernel_share(raw)
    assert entry["value"] == 0.4 and entry["source"]["kind"] == "measured" and "2 points" in entry["source"]["note"]


def test_calibrate_reread_writes_the_share_into_a_profile(tmp_path, capsys):
    out = tmp_path / "mine.json"
    assert main(["profile", "derive", "h100-sxm", "--out", str(out)]) == 0
    assert main(["calibrate", "reread", str(_shared_decode(tmp_path / "raw", 0.3)), "--profile", str(out)]) == 0
    assert load_profile(out)[KERNEL] == 0.3


@pytest.mark.parametrize("f, points, says", [(0.3, ((4096, 4, 4),), "no point re-reads"),
                                             (1.4, ((4096, 1, 8),), "outside (0, 1]")])
def test_calibrate_reread_refuses_what_it_cannot_measure(tmp_path, capsys, f, points, says):
    out = tmp_path / "mine.json"
    assert main(["profile", "derive", "h100-sxm", "--out", str(out)]) == 0
    before = out.read_text()
    assert main(["calibrate", "reread", str(_shared_decode(tmp_path / "raw", f, points)), "--profile", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert out.read_text() == before
