"""Engine calibration: per-key scale/offset, a separate set for eager steps, a host floor."""
import numpy as np
import pandas as pd
import pytest

from granisim.calibration.engine_fit import (ENGINE_KEYS, _floored_lsq, _relative_lsq, fit, host_work,
                                        with_engine)
from granisim.costmodel import step_cost
from granisim.config.hardware import Source, get_profile
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest

GRAPH_MAX_TOKENS = 2048  # the CUDA-graph row limit of the executor that measured the steps


def _steps(rng, n, tokens, truth):
    pred = rng.uniform(1e-3, 2e-1, n)
    batch = rng.integers(1, 64, n)
    passes = rng.integers(0, 3, n)
    rebuilds = rng.integers(0, 2, n)  # steps built in full, not derived from the one before
    df = pd.DataFrame({"tokens": np.full(n, tokens), "batch": batch, "kv_tokens": 0, "passes": passes,
                       "rebuilds": rebuilds, "decode_launches": 1,
                       "measured_overhead": 5e-4 + 1e-5 * batch + 1e-4 * passes + 4e-4 * rebuilds,
                       "predicted_overhead": 1e-3})
    for k in ENGINE_KEYS:
        df[f"predicted_{k}"] = pred
        df[f"measured_{k}"] = truth(pred) * rng.normal(1.0, 0.002, n)
    return df


def test_fit_recovers_graph_and_eager_sets_and_the_floor():
    rng = np.random.default_rng(0)
    graph = _steps(rng, 200, 64, lambda p: 1.1 * p + 3e-4)
    eager = _steps(rng, 80, 4096, lambda p: np.maximum(0.9 * p, 0.03))
    v = fit([graph, eager], GRAPH_MAX_TOKENS)
    assert v["engine.linear.scale"] == pytest.approx(1.1, rel=0.02)
    assert v["engine.linear.offset_s"] == pytest.approx(3e-4, rel=0.1)
    assert v["engine.eager.linear.scale"] == pytest.approx(0.9, rel=0.02)
    assert v["engine.eager.linear_floor_s"] == pytest.approx(0.03, rel=0.1)
    assert v["engine.graph_max_tokens"] == GRAPH_MAX_TOKENS
    assert v["overhead.step_s"] == pytest.approx(5e-4, rel=0.05)
    assert v["overhead.per_request_s"] == pytest.approx(1e-5, rel=0.05)
    assert v["overhead.rebuild_s"] == pytest.approx(4e-4, rel=0.05)
    assert v["overhead.per_pass_s"] == pytest.approx(1e-4, rel=0.05)


def test_scale_is_bounded_when_a_key_barely_varies():
    x = np.full(20, 1e-3) * np.linspace(1.0, 1.01, 20)
    a, b, _ = _floored_lsq(x, x[::-1] * 2.5)  # a decreasing line through a narrow range: a wild slope
    assert 0.5 <= a <= 2.0 and b >= 0


def test_a_narrow_range_fits_an_offset_not_a_scale():
    """Times that barely vary (the control run's 64-token prefix passes, all ~0.16 ms) cannot tell a scale
    from an offset: with 3% noise a free fit picks a wild scale, which then misprices passes 15x longer."""
    rng = np.random.default_rng(1)
    x = rng.uniform(1.55e-4, 1.6e-4, 200)
    y = (x + 5e-5) * rng.normal(1.0, 0.03, 200)
    a, b = _relative_lsq(x, y)
    assert a == 1.0 and b == pytest.approx(5e-5, rel=0.2)
    assert a * 2.4e-3 + b == pytest.approx(2.45e-3, rel=0.01)  # a 16K pass, priced from the control's


def test_the_eager_set_prices_steps_over_the_graph_limit():
    prof, model = get_profile("h200"), get_model("llama-3.1-8b")
    vals = {"engine.linear.scale": 1.0, "engine.linear.offset_s": 0.0, "engine.eager.linear.scale": 2.0,
            "engine.eager.linear.offset_s": 0.0, "engine.graph_max_tokens": 512, "engine.eager.linear_floor_s": 0.5}
    eng = with_engine(prof, vals, Source("measured"))

    def linear(tokens, p):
        plan = BatchPlan(0, "token", 1, (PlannedRequest(0, 0, tokens, True),))
        return step_cost(plan, p, model).breakdown["linear"]

    assert linear(512, eng) == pytest.approx(linear(512, prof))
    assert linear(513, eng) == pytest.approx(max(2.0 * linear(513, prof), 0.5))


def _two_launch_plan():
    """Two decode requests in a cascade group (their suffixes: one launch) and one outside it (a second)."""
    from granisim.core.contract import PrefixGroup

    reqs = (PlannedRequest(0, 300, 1, False, 0, 256), PlannedRequest(1, 310, 1, False, 0, 256),
            PlannedRequest(2, 500, 1, False))
    return BatchPlan(0, "granikv", 1, reqs, (PrefixGroup(7, 256, "slab", "cascade", (0, 1), 8),))


def test_the_decode_offset_is_paid_per_launch():
    """attn_decode's engine offset is fitted and charged once per decode launch (1-2 a step): fitted on steps
    with one and two launches it recovers the per-launch offset, and a two-launch plan pays it twice."""
    rng = np.random.default_rng(2)
    df = _steps(rng, 300, 64, lambda p: p)
    df["decode_launches"] = rng.integers(1, 3, len(df))
    df["measured_attn_decode"] = (df.predicted_attn_decode + 1e-4 * df.decode_launches) * rng.normal(1, 0.002, len(df))
    v = fit([df], GRAPH_MAX_TOKENS)
    assert v["engine.attn_decode.offset_s"] == pytest.approx(1e-4, rel=0.05)
    assert v["engine.attn_decode.scale"] == pytest.approx(1.0, rel=0.01)
    plan = _two_launch_plan()
    assert host_work(plan)["decode_launches"] == 2
    prof, model = get_profile("h200"), get_model("llama-3.1-8b")
    vals = {"engine.attn_decode.scale": 1.0, "engine.attn_decode.offset_s": 1e-4}
    raw = step_cost(plan, prof, model).breakdown["attn_decode"]
    assert step_cost(plan, with_engine(prof, vals, Source("measured")), model).breakdown["attn_decode"] == \
        pytest.approx(raw + 2e-4)


def test_per_layer_offsets_scale_with_the_layers_they_were_fitted_on():
    """The offsets of per-layer kernels (a gap per launch, one launch per layer) fitted on a 32-layer model are
    charged 48/32 times on a 48-layer one (engine.fit_layers; measured on the H200: Qwen-2.5-14B's kv_write
    and merge took 1.50x Llama-3.1-8B's), the linear part's (its flat offset and its offsets by step size)
    too; the lm_head offset (once a step) and the fitted model's own prices stay as fitted, and ``fit``
    records the layers. Planted bug: ignoring fit_layers fails the 48-layer check."""
    rng = np.random.default_rng(3)
    assert fit([_steps(rng, 50, 64, lambda p: p)], GRAPH_MAX_TOKENS, layers=32)["engine.fit_layers"] == 32
    prof = get_profile("h200")
    vals = {**{f"engine.{k}.offset_s": 1e-4 for k in ("kv_write", "linear", "lm_head")},
            **{f"engine.{k}.scale": 1.0 for k in ("kv_write", "linear", "lm_head")}}
    knots = {"engine.linear.offset_t1_s": 2e-4, "engine.linear.offset_t2_s": 3e-4}
    plan = BatchPlan(step=0, policy="token", page_size=1,
                     requests=(PlannedRequest(rid=0, context_len=100, num_new=1, is_prefill=False),))
    for extra, linear_offset in (({}, 1e-4), (knots, 2e-4)):  # the flat offset; the 1-token knot
        plain = with_engine(prof, {**vals, **extra}, Source("measured"))
        scaled = with_engine(prof, {**vals, **extra, "engine.fit_layers": 32.0}, Source("measured"))
        for name, layers in (("llama-3.1-8b", 32), ("qwen-2.5-14b", 48)):
            model = get_model(name)
            assert model.num_layers == layers
            a, b = step_cost(plan, plain, model).breakdown, step_cost(plan, scaled, model).breakdown
            assert b["kv_write"] - a["kv_write"] == pytest.approx(1e-4 * (layers / 32 - 1), abs=1e-12)
            assert b["linear"] - a["linear"] == pytest.approx(linear_offset * (layers / 32 - 1), abs=1e-12)
            assert b["lm_head"] == a["lm_head"]


def test_host_bound_eager_attention_is_fitted_to_its_mean():
    """Eager steps' attention times carry occasional host stalls (here 1 step in 8 takes 10 ms more): the
    fit prices their mean, which a request's TPOT sums, not the stall-free majority."""
    rng = np.random.default_rng(3)
    eager = _steps(rng, 400, 4096, lambda p: p)
    eager["predicted_attn_decode"] = rng.uniform(5e-4, 3e-3, len(eager))  # attention parts: ~1 ms
    stall = np.where(np.arange(len(eager)) % 8 == 0, 1e-2, 0.0)
    eager["measured_attn_decode"] = eager.predicted_attn_decode * 1.2 + 2e-4 + stall
    v = fit([_steps(rng, 50, 64, lambda p: p), eager], GRAPH_MAX_TOKENS)
    a, b = v["engine.eager.attn_decode.scale"], v["engine.eager.attn_decode.offset_s"]
    priced = a * eager.predicted_attn_decode + b
    assert priced.sum() == pytest.approx(eager.measured_attn_decode.sum(), rel=0.02)


def test_the_linear_offset_follows_the_step_size():
    """In the engine a 1-token step's linear part runs under the microbenchmark's plus one flat offset, and
    2-32-token steps over it: one flat offset misprices both. Offsets at knots of step size fit each; a size
    between two knots is priced log-linearly between them."""
    rng = np.random.default_rng(2)
    truth = {1: 3e-4, 2: 5e-4, 4: 5e-4, 8: 5e-4, 16: 5e-4, 32: 5e-4, 64: 2.5e-4, 512: 9e-4}
    frames = []
    for t, b in truth.items():
        df = _steps(rng, 60, t, lambda p: p)
        pred = rng.uniform(4.9e-3, 5.1e-3, 60)  # decode steps' linear part: about 5 ms whatever the size
        frames.append(df.assign(predicted_linear=pred, measured_linear=(pred + b) * rng.normal(1.0, 0.002, 60)))
    v = fit(frames, GRAPH_MAX_TOKENS)
    for t, b in truth.items():
        assert v[f"engine.linear.offset_t{t}_s"] == pytest.approx(b, abs=3e-5)
    prof, model = get_profile("h200"), get_model("llama-3.1-8b")
    eng = with_engine(prof, v, Source("measured"))

    def extra(tokens):
        plan = BatchPlan(0, "token", 1, (PlannedRequest(0, 0, tokens, True),))
        return step_cost(plan, eng, model).breakdown["linear"] - step_cost(plan, prof, model).breakdown["linear"]

    assert extra(1) == pytest.approx(v["engine.linear.offset_t1_s"])
    f = np.log2(45) - 5  # 45 tokens: between the knots at 32 and 64
    assert extra(45) == pytest.approx((1 - f) * v["engine.linear.offset_t32_s"] + f * v["engine.linear.offset_t64_s"])
    # an eager step (over the graph limit) keeps its own flat offset (no eager steps here: the graph steps' flat
    # offset stands in)
    eager = GRAPH_MAX_TOKENS + 1000
    assert extra(eager) == pytest.approx(v["engine.eager.linear.offset_s"])
    assert extra(512) == pytest.approx(9e-4, abs=3e-5) and extra(eager) < 6e-4


def test_prefill_attention_keeps_the_microbenchmark_scale():
    """A prefill scale fitted on some workloads' chunk shapes does not carry to another's (measured: 1.10 on 2-4K-token
    chunks, 0.97 with 8K chunks over a 16K prefix): attn_prefill keeps scale 1, graph and eager, plus its offset."""
    rng = np.random.default_rng(2)
    graph = _steps(rng, 200, 64, lambda p: 1.1 * p + 3e-4)
    eager = _steps(rng, 80, 4096, lambda p: 1.1 * p + 3e-4)
    v = fit([graph, eager], GRAPH_MAX_TOKENS)
    for s in ("", "eager."):
        assert v[f"engine.{s}attn_prefill.scale"] == 1.0
        assert v[f"engine.{s}attn_prefill.offset_s"] > 3e-4  # the best offset for scale 1 takes up part of the 10%
        assert v[f"engine.{s}lm_head.scale"] == pytest.approx(1.1, rel=0.02)  # other keys keep a fitted scale


@pytest.mark.parametrize("path", ["paged", "cascade"])
def test_priced_host_overhead_counts_the_slots_the_fit_counts(path):
    """The fit's regressor (host_work's kv_tokens) and the pricing must count the same slots: a paged group's
    members list their prefix pages too (token's decode re-reads the prefix per request), a cascade group's
    members only their suffixes. A mismatch priced token's 16K-prefix decode overhead at 0.9 ms against 4.4 ms
    measured."""
    from granisim.core.contract import PrefixGroup

    reqs = (PlannedRequest(0, 16_500, 1, False, 0, 16_384), PlannedRequest(1, 16_600, 1, False, 0, 16_384),
            PlannedRequest(2, 900, 1, False))
    plan = BatchPlan(0, "token", 1, reqs, (PrefixGroup(7, 16_384, "slab", path, (0, 1), 2),))
    prof, model = get_profile("h200"), get_model("llama-3.1-8b")
    per_tok = 1e-8
    vals = {"overhead.step_s": 0.0, "overhead.per_request_s": 0.0, "overhead.per_kv_token_s": per_tok,
            "overhead.per_pass_s": 0.0}
    priced = step_cost(plan, with_engine(prof, vals, Source("measured")), model).breakdown["overhead"]
    assert priced == pytest.approx(per_tok * host_work(plan)["kv_tokens"])
    expected = 16_501 + 16_601 + 901 if path == "paged" else (16_501 - 16_384) + (16_601 - 16_384) + 901
    assert host_work(plan)["kv_tokens"] == expected
