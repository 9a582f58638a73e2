"""`attn.decode.skew_stream`: a skewed, split decode batch streams its shared KV more slowly than a batch of equal
lengths; `granisim calibrate skew` fits the factor from the split-balance benchmark (granisim/calibration/skew.py)."""

import json
import math

import numpy as np
import pytest

from granisim.calibration.engine_fit import with_engine
from granisim.calibration.skew import NAME, fit, points, priced_us, trace_lengths
from granisim.cli import main
from granisim.config.hardware import PROFILE_DIR, Source, get_profile, load_profile
from granisim.config.models import get_model
from granisim.costmodel.tables import CostTables

LLAMA = get_model("llama-3.1-8b")
RUN = PROFILE_DIR.parents[2] / "reports" / "kernels" / "split_balance" / "split_balance_run3.json"


def _decode_us(profile, lens) -> float:
    """One layer's decode launch (us) over requests of these own-context lengths (slot lists), as priced."""
    t = CostTables(profile, LLAMA)
    tok, B = int(np.sum(lens)), len(lens)
    qo = B * 2.0 * t.n_q * t.d * t.b
    s = t.decode_time2(tok, B, int(np.max(lens)), tok * t.kvb / t.storage_eff("paged", 1) + qo, gather=True,
                       raw_bytes=tok * t.kvb + qo)
    return float(s) / t.layers * 1e6


def _with(profile, value):
    return with_engine(profile, {NAME: value}, Source("measured"))


def test_the_factor_slows_only_skewed_split_batches():
    """Suffix lengths drawn from the Azure trace at 64 requests (longest 4x the mean: split at the balance cap)
    take the shared stream's time x the factor; 64 equal lengths are priced as before, and so is a small skewed
    batch bound by its longest chunk, not by the stream. Planted bug: a factor read but not applied fails the
    first check."""
    base = get_profile("h200")
    one, more = _with(base, 1.0), _with(base, 1.5)
    skewed = trace_lengths(64, 64)
    assert skewed.max() > 2 * math.ceil(skewed.mean())
    assert _decode_us(more, skewed) > 1.2 * _decode_us(one, skewed)
    assert _decode_us(more, [4096] * 64) == _decode_us(one, [4096] * 64)
    assert _decode_us(more, [100] * 63 + [4000]) == _decode_us(one, [100] * 63 + [4000])  # skewed, split
    assert _decode_us(more, [1000] * 64) == _decode_us(one, [1000] * 64)


def test_fit_recovers_a_planted_factor(tmp_path):
    """Times written as the model prices them at 1.35 fit back to 1.35; at 1.0 to 1.0."""
    t = CostTables(get_profile("h200"), LLAMA)
    run = json.loads(RUN.read_text())
    pts = points(RUN, t)
    for planted in (1.35, 1.0):
        us = dict(zip(((p["case"], p["cap"]) for p in pts), priced_us(pts, t, planted)))
        rows = [{**r, **{f"cap_{c}_us": round(us[(r["case"], c)], 3) for c in run["caps"] if (r["case"], c) in us}}
                for r in run["rows"]]
        f = tmp_path / f"run_{planted}.json"
        f.write_text(json.dumps({**run, "rows": rows}))
        value, err = fit(f, get_profile("h200"))
        assert value == pytest.approx(planted, abs=0.006)
        assert abs(err[f"at_{value:g}"]["median"]) < 0.005


def test_the_shipped_factor_prices_the_benchmark_it_was_fitted_on():
    """h200's factor prices the skewed, split launches of the committed run within 7% (16% low without it)."""
    value, err = fit(RUN, get_profile("h200"))
    assert get_profile("h200")[NAME] == value
    assert err["points"] >= 12 and err["at_1"]["median"] < -0.1
    assert abs(err[f"at_{value:g}"]["median"]) < 0.02 and err[f"at_{value:g}"]["min"] > -0.07


def test_calibrate_skew_writes_the_factor_and_refuses_other_files(tmp_path, capsys):
    """Into a profile of the GPU the benchmark ran on; a file without skewed suffix rows, a run on another GPU,
    or one that does not say when it ran (without --date) is refused in one line (exit 2), the profile left as
    it was."""
    out = tmp_path / "mine.json"
    assert main(["profile", "derive", "h200", "--out", str(out)]) == 0
    before = out.read_text()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [{"case": "uniform B=16 L=4096", "cap_none_us": 75.0}]}))
    h100 = tmp_path / "h100.json"
    h100.write_text(json.dumps({**json.loads(RUN.read_text()), "device": "NVIDIA H100 80GB HBM3"}))
    word = tmp_path / "word.json"  # catches: an AttributeError traceback (exit 1) on rows that are not objects
    word.write_text(json.dumps({"rows": "x"}))
    for bad, says in ((other, "field rows"), (h100, "field device"), (RUN, "give --date"),
                      (word, "field rows: value 'str'")):
        assert main(["calibrate", "skew", str(bad), "--profile", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err and str(bad) in err, err
        assert out.read_text() == before
    assert main(["calibrate", "skew", str(RUN), "--profile", str(out), "--date", "2026-11-29"]) == 0
    entry = json.loads(out.read_text())["coefficients"][NAME]
    assert entry["source"]["kind"] == "measured" and entry["source"]["date"] == "2026-11-29"
    assert load_profile(out)[NAME] == entry["value"] == get_profile("h200")[NAME]


def test_each_measured_profile_carries_the_factor_its_own_gpu_measured():
    """h200 and h100-sxm each fit the factor on their own GPU's split-balance run (the H100's skewed launches lose
    less than the H200's), so the two differ and each is the fit of its run."""
    from granisim.calibration.skew import fit

    runs = {"h200": RUN, "h100-sxm": RUN.parent / "split_balance_h100.json"}
    for name, run in runs.items():
        prof = get_profile(name)
        assert prof.coefficients[NAME].source.kind == "measured" and prof[NAME] == fit(run, prof)[0]
    assert get_profile("h100-sxm")[NAME] < get_profile("h200")[NAME]


def test_the_recorded_command_reruns_with_the_fields_the_run_lacked(tmp_path):
    """catches: the profile recorded `granisim calibrate skew RUN --profile P` for a run whose JSON has no date, a
    command that exits 2 asking for --date."""
    import shlex

    from granisim.calibration.skew import add_to_file

    profile = tmp_path / "h200.json"
    profile.write_text((PROFILE_DIR / "h200.json").read_text())
    entry = add_to_file(RUN, profile, "2026-11-29", "5e12dbd", "torch 2.11.0+cu130, triton 3.6.0")
    command = entry["source"]["command"].split("; ", 1)[1]
    args = shlex.split(command)
    assert args[:3] == ["granisim", "calibrate", "skew"]
    assert args[args.index("--date") + 1] == "2026-11-29" and args[args.index("--commit") + 1] == "5e12dbd"
    assert args[args.index("--versions") + 1] == "torch 2.11.0+cu130, triton 3.6.0"
