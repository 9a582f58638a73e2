"""granisim validation refit --only: a profile with just some coefficient families refitted."""
import pytest

from granisim.validation.refit import only_values

FIT = {"engine.eager.linear.scale": 0.92, "engine.eager.linear.offset_s": 4e-4, "engine.eager.linear_floor_s": 0.0,
       "engine.eager.lm_head.scale": 1.0, "engine.linear.scale": 1.0, "overhead.step_s": 3e-4}


def test_only_takes_the_named_families_and_nothing_else():
    assert only_values(FIT, ["engine.eager.linear"]) == {
        "engine.eager.linear.scale": 0.92, "engine.eager.linear.offset_s": 4e-4, "engine.eager.linear_floor_s": 0.0}
    assert only_values(FIT, ["overhead.", "engine.linear."]) == {"overhead.step_s": 3e-4, "engine.linear.scale": 1.0}


def test_a_prefix_that_names_nothing_is_refused():
    with pytest.raises(ValueError, match="--only engine.eager.linaer: the fit has no coefficient"):
        only_values(FIT, ["engine.eager.linear", "engine.eager.linaer"])


def _steps(gain, cached_share, n_steps=60, seed=0):
    """Eager and graph steps whose measured prefill attention carries the factor (scale 1, offset 1 ms)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    n = rng.integers(1, 6, n_steps)
    cached = rng.random(n_steps) < 0.4
    tokens = rng.choice([1024, 4096, 8192], n_steps)
    kernel = rng.uniform(5e-3, 4e-2, n_steps)
    g = np.where(cached, gain * cached_share, gain)
    factor = np.where(tokens > 2048, 1 + g * (n - 1) / n, 1.3)  # graph steps: anything, never fitted
    return pd.DataFrame({"tokens": tokens, "prefill_requests": n, "prefill_cached": cached & (n > 0),
                         "predicted_attn_prefill": kernel, "measured_attn_prefill": factor * kernel + 1e-3,
                         "scale": 1.0, "offset": 1e-3})


def test_the_multi_prefill_fit_recovers_gain_and_cached_share():
    from granisim.validation.refit import fit_multi_prefill

    v = fit_multi_prefill(_steps(0.3, 0.25), 2048)
    assert v["engine.eager.attn_prefill.multi_gain"] == pytest.approx(0.3, rel=1e-6)
    assert v["engine.eager.attn_prefill.multi_cached"] == pytest.approx(0.25, rel=1e-6)


def test_the_multi_prefill_fit_keeps_its_bounds():
    """Cached-context steps priced over (a negative gain of their own) share 0; no such steps: share 1."""
    from granisim.validation.refit import fit_multi_prefill

    steps = _steps(0.3, -0.5)
    v = fit_multi_prefill(steps, 2048)
    assert v["engine.eager.attn_prefill.multi_gain"] == pytest.approx(0.3, rel=1e-6)
    assert v["engine.eager.attn_prefill.multi_cached"] == 0.0
    v = fit_multi_prefill(steps[~steps.prefill_cached], 2048)
    assert v["engine.eager.attn_prefill.multi_cached"] == 1.0
    with pytest.raises(ValueError, match="no eager step"):
        fit_multi_prefill(steps[steps.prefill_requests < 2], 2048)


def test_several_models_are_pooled_only_for_the_multi_prefill_factor(tmp_path):
    from granisim.validation.refit import main

    with pytest.raises(ValueError, match="several models are pooled only for --only engine.eager.attn_prefill.multi"):
        main([str(tmp_path), "--model", "llama-3.1-8b", "qwen-2.5-14b", "--only", "engine.eager.linear",
              "--out", str(tmp_path / "p.json")])


def test_an_empty_only_prefix_is_refused(tmp_path):
    """catches: --only '' matched every coefficient and refitted them all."""
    from granisim.validation.refit import main

    with pytest.raises(ValueError, match="--only '': an empty prefix names every coefficient"):
        main([str(tmp_path), "--only", "", "--out", str(tmp_path / "p.json")])


def test_a_refit_on_a_profile_made_from_another_is_made_from_it(tmp_path):
    """--keep-from h200-engine-steps (itself made from h200-engine): the refitted profile is made from it, keeps
    its step classes and everything else, and carries the refitted values (write_engine_profile)."""
    import json

    from granisim.config.coefficients import Source
    from granisim.config.hardware import PROFILE_DIR, get_profile, load_profile
    from granisim.validation.report import KEEP, kept_coefficients, write_engine_profile

    out = tmp_path / "cand.json"
    src = Source("measured", date="2026-12-06", command="granisim validation refit RUN", note="test")
    write_engine_profile("h200-engine-steps", {"overhead.step_s": 4e-4}, src, out, {}, "1 unit")
    assert json.loads(out.read_text())["base"]["profile"] == "h200-engine-steps"
    p, steps = load_profile(out), get_profile("h200-engine-steps")
    assert p["overhead.step_s"] == 4e-4 and p.step_classes == steps.step_classes
    assert {k: c for k, c in p.coefficients.items() if not k.startswith(("overhead.step_s", "host."))} == \
        {k: c for k, c in steps.coefficients.items() if not k.startswith(("overhead.step_s", "host."))}
    kept = kept_coefficients(PROFILE_DIR / "h200-engine-steps.json")
    assert set(kept) == {k for k in KEEP if k in steps.coefficients}


def _unit(folder, name: str, stats: dict | None) -> None:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"validation_{name}.json").write_text(json.dumps({} if stats is None else {"executor": stats}))


def test_host_terms_are_not_fitted_across_two_host_paths(tmp_path, capsys):
    """Runs of the engine that listed every id and of the one with the request table: a fit of overhead.* over both
    is refused in one line (exit 2 through the CLI); a fit of other coefficients, or over one host path, goes on.
    Planted bug (tried, seen failing, removed): reading the stat as `stats.get("table")` took every run as listed."""
    from granisim.cli import main as cli
    from granisim.validation.refit import check_one_host_path, host_paths

    old, new = tmp_path / "old", tmp_path / "new"
    _unit(old / "h200_run", "control_short_granikv_llama-3.1-8b", {"graph_max_rows": 2048})
    _unit(old / "h200_run", "control_short_token_llama-3.1-8b", None)
    _unit(new, "control_short_granikv_llama-3.1-8b", {"graph_max_rows": 2048, "request_table": True})
    assert {k: len(v) for k, v in host_paths([old, new]).items()} == {"listed ids": 2, "request table": 1}
    for only in ([], ["overhead."], ["overhead.per_kv"], ["over"]):
        with pytest.raises(ValueError, match="two engine host paths"):
            check_one_host_path([old, new], only)
    check_one_host_path([old, new], ["engine.eager.linear"])
    check_one_host_path([new], [])
    argv = ["validation", "refit", str(old), str(new), "--only", "overhead.", "--out", str(tmp_path / "p.json")]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "request table:" in err[0] and "listed ids:" in err[0], err
