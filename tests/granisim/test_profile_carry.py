"""`granisim profile carry`: an engine profile's corrections written on another GPU's microbenchmark profile, the
re-read of a shared prefix kept at its seconds per byte (granisim/calibration/carry.py)."""

import json

import pytest

from granisim.calibration.carry import REREAD, carry
from granisim.calibration.engine_fit import with_engine
from granisim.cli import main
from granisim.config.hardware import PROFILE_DIR, Source, get_profile, load_profile
from granisim.config.models import get_model
from granisim.config.profile_base import digest
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup
from granisim.costmodel import step_cost

LLAMA = get_model("llama-3.1-8b")


def _reread_seconds(profile, storage: str, policy: str, page_size: int) -> float:
    """What 31 members re-reading one 16K prefix add to a decode step's attention (the share is linear in it)."""
    reqs = tuple(PlannedRequest(rid=i, context_len=16384 + 50 + i, num_new=1, is_prefill=False, group=0,
                                shared_len=16384) for i in range(32))
    g = PrefixGroup(key=7, prefix_len=16384, storage=storage, path="paged", members=tuple(range(32)), m_eff=128)
    plan = BatchPlan(step=0, policy=policy, page_size=page_size, requests=reqs, groups=(g,))
    half = with_engine(profile, {REREAD: 0.5 * profile[REREAD]}, Source("measured"))
    return 2 * (step_cost(plan, profile, LLAMA).breakdown["attn_decode"]
                - step_cost(plan, half, LLAMA).breakdown["attn_decode"])


def _carried(tmp_path, onto="h100-sxm"):
    out = tmp_path / "carried.json"
    assert main(["profile", "carry", "h200-engine", "--onto", onto, "--out", str(out)]) == 0
    return out


def test_carry_keeps_the_corrections_and_a_reread_at_its_seconds_per_byte(tmp_path):
    """On an H100 (0.70x the H200's decode stream, the same SMs) a re-read of a shared prefix, served from L2, takes
    the H200's time: the carried share is 0.85 x 0.70. Planted bugs: the share carried unchanged prices the re-reads
    +42% (token) over the H200's; the ratio inverted, +100%."""
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
    assert new["hbm_bandwidth"] == get_profile("h100-sxm")["hbm_bandwidth"]  # the rates are the new GPU's
    assert 0.55 < new[REREAD] < 0.65
    for storage, policy, page in (("token", "token", 1), ("paged", "paged16", 16)):
        ratio = _reread_seconds(new, storage, policy, page) / _reread_seconds(old, storage, policy, page)
        assert ratio == pytest.approx(1.0, abs=0.06), (storage, ratio)  # storage efficiencies differ a little


def test_carry_onto_its_own_base_changes_no_price(tmp_path):
    """Carried onto the GPU it was fitted on, the profile prices as the engine profile (the values, not the
    sources, are the same)."""
    new, old = load_profile(_carried(tmp_path, onto="h200")), get_profile("h200-engine")
    assert {k: c.value for k, c in new.coefficients.items()} == {k: c.value for k, c in old.coefficients.items()}


def test_a_share_that_would_exceed_one_is_held_at_one():
    """A GPU whose decode stream outruns its L2 (by the ratio) re-reads at no more than a first read costs."""
    coefs = {REREAD: {"value": 0.85, "unit": "", "source": {"kind": "measured", "date": "d", "command": "c"}}}
    got = carry(coefs, "h200-engine", get_profile("h200"), get_profile("b200"))[REREAD]
    assert got["value"] == 1.0 and "at most 1" in got["source"]["how"]


@pytest.mark.parametrize("args, says", [
    (["carry", "h200", "--onto", "h100-sxm", "--out", "p.json"], "field base: value None"),
    (["carry", "h200-engine-steps", "--onto", "h100-sxm", "--out", "p.json"], "field step_classes"),
    (["carry", "h200-engine", "--onto", "nope", "--out", "p.json"], "unknown profile"),
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
