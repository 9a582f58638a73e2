"""`granisim validation step-parts`: predicted / measured by step class and part."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from granisim.cli import main
from granisim.validation.step_parts import class_table, step_class


def _plan(n_prefill: int, n_decode: int):
    reqs = [SimpleNamespace(is_prefill=True)] * n_prefill + [SimpleNamespace(is_prefill=False)] * n_decode
    return SimpleNamespace(requests=reqs)


def test_steps_are_classed_by_size_and_prefilling_requests():
    assert step_class(40, 0)[1] == "decode"
    assert step_class(512, 1)[1] == "prefill <= 512 tokens, 1 req"
    assert step_class(513, 2)[1] == "prefill <= 2048 tokens, 2 req"
    assert step_class(8192, 7)[1] == "prefill > 2048 tokens, 4+ req"
    keys = [step_class(t, n)[0] for t, n in ((8192, 7), (40, 0), (3000, 1), (600, 3))]
    assert sorted(keys) == [(0, 0), (2, 3), (3, 1), (3, 4)]


def test_a_class_ratio_is_of_sums_not_a_mean_of_ratios():
    """Two prefill steps of one class, measured 1 s and 3 s, each priced 2 s: on the whole priced right (1.0),
    where the mean of the per-step ratios would say 1.33. A part the class never ran is NaN, not 0 or inf."""
    steps = pd.DataFrame({"tokens": [4096, 4096, 16], "measured_s": [1.0, 3.0, 0.01], "predicted_s": [2.0, 2.0, 0.02],
                          "measured_linear": [1.0, 3.0, 0.01], "predicted_linear": [2.0, 2.0, 0.02],
                          "measured_attn_prefill": [0.0, 0.0, 0.0], "predicted_attn_prefill": [0.1, 0.0, 0.0]})
    t = class_table(steps, [_plan(2, 3), _plan(2, 0), _plan(0, 16)])
    assert list(t["class"]) == ["decode", "prefill > 2048 tokens, 2 req"]
    row = t.set_index("class").loc["prefill > 2048 tokens, 2 req"]
    assert row["steps"] == 2 and row["measured_s"] == 4.0
    assert row["total"] == pytest.approx(1.0) and row["linear"] == pytest.approx(1.0)
    assert np.isnan(row["attn_prefill"])
    assert t.set_index("class").loc["decode", "total"] == pytest.approx(2.0)
    assert "host_between_ms" not in t  # a run from before the loop timed its own host work


def test_the_loops_host_time_is_a_median_per_class_and_not_a_part():
    steps = pd.DataFrame({"tokens": [16, 16, 16, 4096], "measured_s": [0.01] * 4, "predicted_s": [0.01] * 4,
                          "measured_linear": [0.01] * 4, "predicted_linear": [0.02] * 4,
                          "host_between_s": [1e-4, 9e-4, 2e-4, 5e-3]})
    t = class_table(steps, [_plan(0, 16)] * 3 + [_plan(1, 0)]).set_index("class")
    assert t.loc["decode", "host_between_ms"] == pytest.approx(0.2)
    assert t.loc["prefill > 2048 tokens, 1 req", "host_between_ms"] == pytest.approx(5.0)
    from granisim.validation.step_parts import format_table
    assert format_table("u", t.reset_index()).splitlines()[2].endswith("| total | step_err_p50 | linear | host_between_ms |")


def test_missing_run_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["validation", "step-parts", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nope'}: no such run folder"


def test_a_folder_without_units_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["validation", "step-parts", str(tmp_path)]) == 2
    assert "no validation units under" in capsys.readouterr().err


def test_token_bins_from_their_edges():
    from granisim.validation.step_parts import token_bins

    bins = token_bins((2048, 4096, 6144))
    assert [label for _, label in bins] == ["<= 2048", "<= 4096", "<= 6144", "> 6144"]
    assert step_class(5000, 2, bins)[1] == "prefill <= 6144 tokens, 2 req"
    assert step_class(9000, 1, bins)[1] == "prefill > 6144 tokens, 1 req"
    assert step_class(9000, 1)[1] == "prefill > 2048 tokens, 1 req"  # the default bins


def test_set_prices_with_a_coefficient_replaced_and_checks_it(tmp_path, capsys):
    """--set NAME=VALUE is checked like a profile file's value (planted: no rule check lets 2.0 through)."""
    from granisim.config.hardware import get_profile, with_values

    base = get_profile("h200-engine")
    what_if = with_values(base, {"attn.decode.shared_reread": 0.7})
    assert what_if["attn.decode.shared_reread"] == 0.7 and base["attn.decode.shared_reread"] != 0.7
    assert what_if["hbm_bandwidth"] == base["hbm_bandwidth"]
    assert "set by hand" in what_if.coefficients["attn.decode.shared_reread"].source.describe()
    for bad, why in (("attn.decode.shared_reread=2", "must be in (0, 1]"), ("no.such.thing=1", "unknown coefficient"),
                     ("attn.decode.shared_reread", "NAME=VALUE"), ("attn.decode.shared_reread=x", "NAME=VALUE")):
        assert main(["validation", "step-parts", str(tmp_path), "--set", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert why in err and len(err.splitlines()) == 1, err


def test_decode_steps_are_classed_by_batch_when_asked():
    edges = (4, 8, 64)
    assert step_class(3, 0, batch=3, decode_edges=edges)[1] == "decode, 1-4 req"
    assert step_class(5, 0, batch=5, decode_edges=edges)[1] == "decode, 5-8 req"
    assert step_class(64, 0, batch=64, decode_edges=edges)[1] == "decode, 9-64 req"
    assert step_class(65, 0, batch=65, decode_edges=edges)[1] == "decode, > 64 req"
    assert step_class(600, 2, batch=9, decode_edges=edges)[1] == "prefill <= 2048 tokens, 2 req"  # prefill: by tokens
    keys = [step_class(b, 0, batch=b, decode_edges=edges)[0] for b in (65, 1, 9, 6)]
    assert sorted(keys) == [(0, 0), (0, 1), (0, 2), (0, 3)]  # decode bins ahead of prefill, in batch order


def test_decode_bins_split_the_decode_class_by_each_steps_batch():
    """Two decode steps of 2 and 40 requests: one class each, with its own ratio (a bin read off the tokens, or
    every step in the first bin, fails); without bins they share 'decode'. Pooling two units' steps is the same
    table over their concatenation: ratios of sums."""
    steps = pd.DataFrame({"tokens": [2, 40, 40], "batch": [2, 40, 40], "measured_s": [1.0, 2.0, 6.0],
                          "predicted_s": [1.5, 3.0, 5.0]})
    plans = [_plan(0, 2), _plan(0, 40), _plan(0, 40)]
    t = class_table(steps, plans, decode_edges=(4, 32)).set_index("class")
    assert t.loc["decode, 1-4 req", "total"] == pytest.approx(1.5)
    assert t.loc["decode, > 32 req", "total"] == pytest.approx(1.0) and t.loc["decode, > 32 req", "steps"] == 2
    assert list(class_table(steps, plans)["class"]) == ["decode"]
    pooled = class_table(pd.concat([steps.iloc[:2], steps.iloc[2:]], ignore_index=True), plans, decode_edges=(4, 32))
    assert pooled.set_index("class").loc["decode, > 32 req", "total"] == pytest.approx(8.0 / 8.0)


def test_skew_bins_split_decode_steps_by_their_longest_context_over_the_mean():
    """Two decode steps of 4 requests, one of equal contexts (skew 1) and one with a request 5x the others'
    (skew 2.5): one class each under --skew-bins, after the batch bin; prefill steps are not split. Planted bugs
    caught: the skew of all requests counting prefill rows, a max over min instead of over the mean."""
    def plan(ctxs, n_prefill=0):
        reqs = [SimpleNamespace(is_prefill=True, context_len=0)] * n_prefill + \
            [SimpleNamespace(is_prefill=False, context_len=c - 1) for c in ctxs]
        return SimpleNamespace(requests=reqs)

    from granisim.validation.step_parts import batch_skew
    assert batch_skew(plan([100, 100, 100, 100])) == pytest.approx(1.0)
    assert batch_skew(plan([500, 100, 100, 100])) == pytest.approx(500 / 200)
    assert batch_skew(plan([500, 100, 100, 100], n_prefill=3)) == pytest.approx(2.5)
    steps = pd.DataFrame({"tokens": [4, 4, 300], "batch": [4, 4, 4], "measured_s": [1.0, 1.0, 1.0],
                          "predicted_s": [1.0, 0.8, 1.0]})
    plans = [plan([100] * 4), plan([500, 100, 100, 100]), plan([100] * 3, n_prefill=1)]
    t = class_table(steps, plans, decode_edges=(8,), skew_edges=(1.5, 2)).set_index("class")
    assert t.loc["decode, 1-8 req, skew <= 1.5", "total"] == pytest.approx(1.0)
    assert t.loc["decode, 1-8 req, skew > 2", "total"] == pytest.approx(0.8)
    assert "prefill <= 512 tokens, 1 req" in t.index
    assert step_class(4, 0, skew=1.7, skew_edges=(1.5, 2))[1] == "decode, skew <= 2"


@pytest.mark.parametrize("value", ["2,1.5", "x", "0.5,2", "1,inf"])
def test_bad_skew_bins_are_one_line_and_exit_2(tmp_path, capsys, value):
    assert main(["validation", "step-parts", str(tmp_path), "--skew-bins", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --skew-bins {value!r}: give ascending numbers") and "\n" not in err


@pytest.mark.parametrize("flag,value", [("--decode-bins", "8,4"), ("--decode-bins", "x"), ("--bins", "0,512")])
def test_bad_bins_are_one_line_and_exit_2(tmp_path, capsys, flag, value):
    assert main(["validation", "step-parts", str(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag} {value!r}: give ascending whole numbers") and "\n" not in err


def test_pool_sums_the_units_steps_per_model_and_policy_or_per_machine(tmp_path, monkeypatch, capsys):
    """Three units (two machines, two policies): --pool gives one table per model and policy over its units'
    steps (token's two units pooled: ratio of the sums), --pool machine one per machine too. Planted bugs caught:
    pooling by the unit (three tables under --pool), or the machine key under the default."""
    import json

    import granisim.validation.step_parts as sp

    def unit(pred, meas):
        return (pd.DataFrame({"tokens": [8], "batch": [8], "measured_s": [meas], "predicted_s": [pred]}), [_plan(0, 8)])

    found = {"runA": [("multi_agent_16k_token_llama-3.1-8b", *unit(1.0, 2.0)),
                      ("multi_agent_16k_granikv_llama-3.1-8b", *unit(1.0, 1.0))],
             "runB": [("multi_agent_16k_token_llama-3.1-8b", *unit(4.0, 2.0))]}
    monkeypatch.setattr(sp, "run_units", lambda run: ((f"{run.name}/{n}", s, p, "llama-3.1-8b") for n, s, p in found[run.name]))
    monkeypatch.setattr(sp, "reprice", lambda steps, plans, prof, model: steps)
    runs = [tmp_path / "runA", tmp_path / "runB"]
    for r in runs:
        r.mkdir()
    out = tmp_path / "parts.json"
    assert main(["validation", "step-parts", *map(str, runs), "--pool", "--out", str(out)]) == 0
    pooled = json.loads(out.read_text())["pooled"]
    assert sorted(pooled) == ["llama-3.1-8b granikv", "llama-3.1-8b token"]
    tok = pooled["llama-3.1-8b token"]
    assert tok["units"] == 2 and tok["classes"][0]["total"] == pytest.approx(5.0 / 4.0)
    assert main(["validation", "step-parts", *map(str, runs), "--pool", "machine", "--out", str(out)]) == 0
    assert sorted(json.loads(out.read_text())["pooled"]) == [
        "runA llama-3.1-8b granikv", "runA llama-3.1-8b token", "runB llama-3.1-8b token"]
    assert "pooled: llama-3.1-8b token (2 units)" in capsys.readouterr().out


def test_a_class_step_error_is_the_median_of_its_steps_errors():
    """|predicted / measured - 1| of 0.1, 0.2 and 0.9 (one step under): 0.2, as the report's per-step median;
    the mean (0.4) or the signed median (+0.1) would fail."""
    steps = pd.DataFrame({"tokens": [8] * 3, "measured_s": [1.0, 1.0, 1.0], "predicted_s": [1.1, 0.8, 1.9]})
    t = class_table(steps, [_plan(0, 8)] * 3)
    assert t.loc[0, "step_err_p50"] == pytest.approx(0.2)
