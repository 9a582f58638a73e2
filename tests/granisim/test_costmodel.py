"""Cost model: closed forms, monotonicity, fast-forward exactness, dense vs cascade, re-reads."""

import math

import numpy as np
import pytest

from granisim.costmodel import (BREAKDOWN_KEYS, cheaper_path, cost_tables, fit_roofline, group_path_cost,
                                m_sat_crossover, op_work, roofline_time, step_cost)
from granisim.costmodel.executor import CostExecutor
from granisim.config.hardware import get_profile
from granisim.kv.hot_pool import KVCopy
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, Executor, PlannedRequest, PrefixGroup

A100 = get_profile("a100-80gb")
H200 = get_profile("h200")
LLAMA = get_model("llama-3.1-8b")
G = LLAMA.group_size
KVB = 2 * LLAMA.n_kv_heads * LLAMA.head_dim * LLAMA.dtype_bytes  # K+V bytes / token / layer


def decode(rid, ctx, group=-1, shared=0):
    return PlannedRequest(rid=rid, context_len=ctx, num_new=1, is_prefill=False, group=group, shared_len=shared)


def prefill(rid, ctx, n):
    return PlannedRequest(rid=rid, context_len=ctx, num_new=n, is_prefill=True)


def plan(reqs, groups=(), policy="granikv", page_size=1, copies=(), steps=1):
    return BatchPlan(step=0, policy=policy, page_size=page_size, requests=tuple(reqs), groups=tuple(groups),
                     copies=tuple(copies), num_steps=steps)


def group_plan(b, prefix, path, storage="slab", suffix=50, policy="granikv", page_size=1, steps=1):
    reqs = [decode(i, prefix + suffix + i, 0, prefix) for i in range(b)]
    g = PrefixGroup(key=7, prefix_len=prefix, storage=storage, path=path, members=tuple(range(b)), m_eff=b * G)
    return plan(reqs, [g], policy=policy, page_size=page_size, steps=steps)


def cost(p, profile=A100, model=LLAMA):
    return step_cost(p, profile, model)


# ---- shape of the result ------------------------------------------------------------------------
def test_breakdown_keys_and_sum():
    r = cost(group_plan(16, 4096, "cascade"))
    assert tuple(r.breakdown) == BREAKDOWN_KEYS
    assert r.duration_s == pytest.approx(sum(r.breakdown.values()), rel=1e-12)
    assert r.next_tokens is None and r.step_durations is None
    assert all(v >= 0 for v in r.breakdown.values())
    assert r.breakdown["attn_prefix"] > 0 and r.breakdown["merge"] > 0 and r.breakdown["attn_prefill"] == 0


def test_executor_protocol():
    """The executor's result for a fast-forward plan of 5 decode steps: one positive duration per step, summing to
    the total, which the breakdown's parts also sum to; step s prices the single-step plan whose contexts grew by s
    (so the steps do not get cheaper); more new tokens cost more. Planted bugs: step_durations spread evenly
    (``[total / n] * n``) fails; contexts not grown per step in the fast-forward
    (``s`` dropped in the decode term, either form) fails it too; a breakdown key left out of the total fails the sum."""
    ex = CostExecutor("a100-80gb", "llama-3.1-8b")
    ex_typed: Executor = ex  # structural: needs_layouts, max_steps_per_plan, execute
    assert callable(ex_typed.execute)
    assert ex.needs_layouts is False and ex.max_steps_per_plan >= 1 << 20
    n = 5
    p = group_plan(8, 2048, "dense", steps=n)
    for prof in (A100, H200):  # both decode forms (attn.form 1 and 2)
        _check_fast_forward(CostExecutor(prof, LLAMA), p, n)
    assert CostExecutor(A100, LLAMA).execute(p).duration_s == pytest.approx(ex.execute(p).duration_s, rel=1e-12)


def _check_fast_forward(ex, p, n):
    r = ex.execute(p)
    assert r.next_tokens is None
    assert tuple(r.breakdown) == BREAKDOWN_KEYS and all(v >= 0 for v in r.breakdown.values())
    assert sum(r.breakdown.values()) == pytest.approx(r.duration_s, rel=1e-12)
    assert len(r.step_durations) == n and all(d > 0 for d in r.step_durations)
    assert sum(r.step_durations) == pytest.approx(r.duration_s, rel=1e-12)
    assert all(b >= a for a, b in zip(r.step_durations, r.step_durations[1:]))
    assert r.step_durations[-1] > r.step_durations[0]  # 4 more tokens of KV per request to read
    for s, got in enumerate(r.step_durations):
        grown = plan([decode(q.rid, q.context_len + s, q.group, q.shared_len) for q in p.requests], p.groups)
        one = ex.execute(grown)
        assert one.step_durations is None
        assert got == pytest.approx(one.duration_s, rel=1e-9), s
    times = [ex.execute(plan([prefill(0, 0, t)])).duration_s for t in (16, 256, 1024, 4096)]
    assert all(b > a for a, b in zip(times, times[1:])), times


# ---- closed forms ---------------------------------------------------------------------------------
def test_one_decode_request_closed_form():
    """attention = bytes / (bandwidth * decode mem_eff * storage eff) per layer + one launch per layer."""
    ctx = 3000
    for policy, page, storage_eff in (("paged", 16, A100["storage.page16_eff"]), ("token", 1, A100["storage.page1_eff"])):
        r = cost(plan([decode(0, ctx)], policy=policy, page_size=page))
        L, P, BW = LLAMA.num_layers, A100.bf16_flops, A100.hbm_bandwidth
        nbytes = (ctx + 1) * KVB / storage_eff + 2 * LLAMA.n_q_heads * LLAMA.head_dim * 2
        expect = L * (nbytes / (BW * A100["attn.decode.mem_eff"]) + A100["overhead.kernel_launch_s"])
        flops = 4 * LLAMA.n_kv_heads * 16 * LLAMA.head_dim * (ctx + 1)  # G=4 rows padded to 16
        assert flops / (P * A100["attn.decode.flop_eff"]) < nbytes / (BW * A100["attn.decode.mem_eff"])
        assert r.breakdown["attn_decode"] == pytest.approx(expect, rel=1e-12)
        kvw = L * (2 * KVB / (BW * A100["kv.write_eff"]) + A100["overhead.kernel_launch_s"])
        assert r.breakdown["kv_write"] == pytest.approx(kvw, rel=1e-12)
        assert r.breakdown["overhead"] == A100["overhead.step_s"]
        head_f, head_b = op_work("lm_head", 1, LLAMA)
        assert r.breakdown["lm_head"] == pytest.approx(float(roofline_time(
            head_f, head_b, P, BW, A100["linear.lm_head.launch_s"], A100["linear.lm_head.flop_eff"],
            A100["linear.lm_head.mem_eff"])), rel=1e-12)


def test_linear_equals_vidur_table_at_grid_points():
    t = A100.linear_table
    i = t.num_tokens.index(1024)
    per_layer = sum(t.ops_ms[c][i] for c in ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                                            "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj"))
    per_layer += 2 * t.ops_ms["add"][i]
    expect = (LLAMA.num_layers * per_layer + t.ops_ms["emb"][i] + t.ops_ms["input_layernorm"][i]) * 1e-3
    got = cost_tables(A100, LLAMA).linear_time(1024)
    assert got <= expect * (1 + 1e-12) and got == pytest.approx(expect, rel=0.03)  # padded-up min only lowers


def test_kv_copy_closed_form():
    copies = (KVCopy(src=100, dst=0, length=300), KVCopy(src=900, dst=300, length=200))
    r = cost(plan([decode(0, 10)], copies=copies))
    L = LLAMA.num_layers
    expect = 500 * 2 * KVB * L / (A100.hbm_bandwidth * A100["kv.copy_eff"]) + L * A100["overhead.kernel_launch_s"]
    assert r.breakdown["kv_copy"] == pytest.approx(expect, rel=1e-12)
    assert cost(plan([decode(0, 10)])).breakdown["kv_copy"] == 0


# ---- monotonicity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", [A100, H200], ids=["a100", "h200"])
@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen-2.5-32b"])
def test_more_tokens_never_cheaper(profile, model):
    m = get_model(model)
    t = cost_tables(profile, m)
    lin = [t.linear_time(n) for n in range(1, 40000, 37)]
    assert np.all(np.diff(lin) >= 0)
    prev = 0.0
    for n in (1, 2, 7, 64, 65, 128, 500, 2048, 4096, 16384):
        d = step_cost(plan([prefill(0, 1000, n)]), profile, m).duration_s
        assert d >= prev
        prev = d


def test_longer_context_never_cheaper():
    for mk in (lambda c: plan([decode(0, c)]), lambda c: plan([prefill(0, c, 256)]),
               lambda c: group_plan(8, 1024, "cascade", suffix=c),
               lambda c: group_plan(8, c + 16, "dense"), lambda c: group_plan(8, c + 16, "paged", policy="paged",
                                                                           storage="paged", page_size=16)):
        d = [cost(mk(c)).duration_s for c in (1, 10, 100, 1000, 5000, 20000, 60000)]
        assert np.all(np.diff(d) >= 0), d


def test_more_requests_never_cheaper():
    for path in ("paged", "cascade", "dense"):
        d = [cost(group_plan(b, 8192, path)).duration_s for b in (1, 2, 4, 16, 64, 128, 300)]
        assert np.all(np.diff(d) > 0), (path, d)


def test_storage_gathers_cost_more_than_slabs():
    slab = cost(group_plan(16, 8192, "paged", storage="slab")).breakdown["attn_decode"]
    p16 = cost(group_plan(16, 8192, "paged", storage="paged", policy="paged", page_size=16)).breakdown["attn_decode"]
    p1 = cost(group_plan(16, 8192, "paged", storage="cold")).breakdown["attn_decode"]
    assert slab < p16 < p1
    c_slab = cost(group_plan(16, 8192, "cascade")).breakdown["attn_prefix"]
    c_cold = cost(group_plan(16, 8192, "cascade", storage="cold")).breakdown["attn_prefix"]
    assert c_slab < c_cold
    with pytest.raises(ValueError, match="slab"):
        cost(group_plan(16, 8192, "dense", storage="cold"))


def test_bigger_model_costs_more():
    p = group_plan(32, 4096, "cascade")
    assert cost(p, model=get_model("qwen-2.5-32b")).duration_s > cost(p, model=get_model("qwen-2.5-14b")).duration_s \
        > cost(p).duration_s
    assert cost(p, profile=H200).duration_s < cost(p).duration_s


# ---- decode fast-forward --------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["paged", "cascade", "dense"])
@pytest.mark.parametrize("profile,members", [("a100-80gb", 12), ("h200-engine", 600)])  # 600: an eager engine step
def test_num_steps_equals_sum_of_single_steps(path, profile, members):
    n = 37
    prof = get_profile(profile)
    base = group_plan(members, 3000, path, suffix=20, steps=n)
    extra = [decode(1000, 50), decode(1001, 7000)]
    multi = plan(list(base.requests) + extra, base.groups, steps=n,
                 copies=(KVCopy(src=10, dst=0, length=5),))
    r = cost(multi, prof)
    singles, after = [], None
    for s in range(n):  # each priced after the one before (an engine profile's full build: the first step's only)
        reqs = [PlannedRequest(q.rid, q.context_len + s, 1, False, q.group, q.shared_len) for q in multi.requests]
        single = plan(reqs, multi.groups, copies=multi.copies if s == 0 else ())
        singles.append(step_cost(single, prof, LLAMA, after))
        after = single
    assert r.step_durations == tuple(x.duration_s for x in singles)  # bit for bit
    assert r.duration_s == sum(x.duration_s for x in singles)
    for k in BREAKDOWN_KEYS:
        assert r.breakdown[k] == pytest.approx(sum(x.breakdown[k] for x in singles), rel=1e-12, abs=1e-15)


def test_num_steps_rejects_prefill():
    with pytest.raises(ValueError, match="decode-only"):
        cost(plan([decode(0, 10), prefill(1, 0, 100)], steps=3))


# ---- shared prefix: re-read vs once ---------------------------------------------------------------
def test_paged_rereads_prefix_per_request_cascade_once():
    L, B = 16384, 16
    launches = LLAMA.num_layers * A100["overhead.kernel_launch_s"]
    one = cost(group_plan(1, L, "paged", suffix=0)).breakdown["attn_decode"] - launches
    paged = cost(group_plan(B, L, "paged", suffix=0)).breakdown["attn_decode"] - launches
    assert paged / one == pytest.approx(B, rel=1e-3)  # B x the prefix bytes
    prefix_read = L * KVB * LLAMA.num_layers / (A100.hbm_bandwidth * A100["attn.cascade.mem_eff"])
    casc = cost(group_plan(B, L, "cascade", suffix=0)).breakdown["attn_prefix"]
    assert prefix_read < casc < 1.5 * prefix_read  # ~once (+ launches, fp32 split partials)
    assert (paged + launches) / casc > 0.75 * B


# ---- dense vs cascade (A100) ----------------------------------------------------------------------
def test_dense_loses_at_small_m_eff_and_wins_at_large():
    for lp in (4096, 16384):
        for b in (1, 4, 16, 64):
            assert group_path_cost(A100, LLAMA, "cascade", lp, b) < group_path_cost(A100, LLAMA, "dense", lp, b)
            assert cheaper_path(A100, LLAMA, lp, b) == "cascade"
        for b in (512, 1024, 4096):
            assert group_path_cost(A100, LLAMA, "dense", lp, b) < group_path_cost(A100, LLAMA, "cascade", lp, b)
            assert cheaper_path(A100, LLAMA, lp, b) == "dense"
    assert cheaper_path(A100, LLAMA, 16384, 4096, storage="cold") == "cascade"


def test_dense_occupancy_penalty():
    """Dense at few M tiles leaves SMs idle: the pass costs the same from M_eff = 4 to one full wave."""
    t1 = group_path_cost(A100, LLAMA, "dense", 16384, 1)
    t32 = group_path_cost(A100, LLAMA, "dense", 16384, 32)
    floor = 16384 * KVB * LLAMA.num_layers / A100.hbm_bandwidth
    assert t1 == pytest.approx(t32, rel=1e-9) and t1 > 10 * floor


def test_a100_crossover_near_published_m_sat():
    x = m_sat_crossover(A100, LLAMA, 16384)
    assert x is not None and abs(x - 1024) <= 64
    for lp in (1024, 4096, 32768):
        x = m_sat_crossover(A100, LLAMA, lp)
        assert x is not None and 256 <= x <= 2048


def test_prefix_path_in_plan_matches_group_path_cost():
    for path in ("dense", "cascade"):
        r = cost(group_plan(64, 16384, path))
        assert r.breakdown["attn_prefix"] == group_path_cost(A100, LLAMA, path, 16384, 64)


# ---- fitting helper (used by calibration) ---------------------------------------------------------
def test_fit_roofline_recovers_known_coefficients():
    n = np.unique(np.geomspace(1, 32768, 80).astype(int)).astype(float)
    f, b = op_work("mlp_down", n, LLAMA)
    truth = (4e-6, 0.7, 0.8)
    t = roofline_time(f, b, 312e12, 2.039e12, *truth)
    got = fit_roofline(f, b, t, 312e12, 2.039e12)
    assert got[0] == pytest.approx(truth[0], rel=0.05, abs=2e-7)
    assert got[1] == pytest.approx(truth[1], rel=0.01) and got[2] == pytest.approx(truth[2], rel=0.01)
    f0, b0 = op_work("norm", n, LLAMA)
    t0 = roofline_time(f0, b0, 312e12, 2.039e12, 2e-6, 1.0, 0.4)
    got = fit_roofline(f0, b0, t0, 312e12, 2.039e12)
    assert got[1] == 1.0 and got[2] == pytest.approx(0.4, rel=0.01) and got[0] == pytest.approx(2e-6, rel=0.05)


def test_empty_plan_costs_the_overhead_only():
    r = cost(plan([]))
    assert r.duration_s == A100["overhead.step_s"]
    assert math.isclose(sum(r.breakdown.values()), r.duration_s)


# ---- as the engine launches: stacked prefix passes, two decode launches -------------------------------
def _groups_plan(k, b, prefix, path="cascade", extra_plain=0):
    reqs, groups = [], []
    for g in range(k):
        ids = tuple(range(len(reqs), len(reqs) + b))
        reqs += [decode(i, prefix + 100 + 7 * i, g, prefix) for i in ids]
        groups.append(PrefixGroup(key=g, prefix_len=prefix, storage="slab", path=path, members=ids, m_eff=b * G))
    reqs += [decode(len(reqs) + i, 3000 + i) for i in range(extra_plain)]
    return plan(reqs, groups)


@pytest.mark.parametrize("path", ["cascade", "dense"])
def test_groups_of_one_path_share_one_launch(path):
    """k groups in one step cost one stacked launch: more than one group alone, less than k alone."""
    one = cost(_groups_plan(1, 16, 16384, path), H200).breakdown["attn_prefix"]
    four = cost(_groups_plan(4, 16, 16384, path), H200).breakdown["attn_prefix"]
    assert one < four < 4 * one
    t = cost_tables(H200, LLAMA)
    assert t.prefix_pass_time(path, ((16384, 16 * G),), "slab") == pytest.approx(
        t.prefix_time(path, 16384, 16 * G, "slab"), rel=0.05)  # one group: the per-group form, to a tile


def test_pass_members_and_whole_contexts_are_two_decode_launches():
    """A step's attn_decode = the members' suffix launch + the whole-context launch, priced apart."""
    both = cost(_groups_plan(2, 8, 4096, extra_plain=5), H200).breakdown["attn_decode"]
    suffix = cost(_groups_plan(2, 8, 4096), H200).breakdown["attn_decode"]
    plain = cost(plan([decode(i, 3000 + i) for i in range(5)]), H200).breakdown["attn_decode"]
    assert both == pytest.approx(suffix + plain, rel=1e-9)


def test_shared_prefix_rereads_cost_a_fraction_after_the_first_member():
    """attn.decode.shared_reread: in a paged group every member after the first re-reads the prefix from L2."""
    from granisim.calibration.engine_fit import with_engine
    from granisim.config.hardware import Source

    cheap = with_engine(H200, {"attn.decode.shared_reread": 0.25}, Source("measured"))
    one, many = group_plan(1, 16384, "paged"), group_plan(32, 16384, "paged")
    assert cost(one, cheap).breakdown["attn_decode"] == pytest.approx(cost(one, H200).breakdown["attn_decode"])
    full, reread = cost(many, H200).breakdown["attn_decode"], cost(many, cheap).breakdown["attn_decode"]
    assert reread < 0.5 * full
    assert reread > cost(one, H200).breakdown["attn_decode"]  # the first member still streams the whole prefix


def test_skewed_decode_batch_never_cheaper_at_the_same_total_kv():
    """A decode kernel lasts at least as long as its longest sequence (or split) takes to stream alone, so at a
    fixed total of KV tokens, moving tokens from the other sequences into one never makes the kernel cheaper.
    Measured on the H200 engine: ragged batches of 8-32 requests ran 15-20% over a mean-length pricing
    (reports/validation/README.md). Planted bug: pricing every program at the batch's mean length (dropping
    ``longest_bytes`` in ``decode_time2``) fails at 32 requests."""
    for b in (4, 8, 16, 32):
        total = 2048 * b
        costs = []
        for share in (1 / b, 0.25, 0.5, 0.75):
            longest = int(total * share)
            lens = [longest] + [(total - longest) // (b - 1)] * (b - 1)
            costs.append(cost(plan([decode(i, c) for i, c in enumerate(lens)], policy="token"), H200)
                         .breakdown["attn_decode"])
        assert np.all(np.diff(costs) >= 0), (b, costs)


@pytest.mark.parametrize("profile", [H200, get_profile("h200-engine")], ids=["h200", "h200-engine"])
@pytest.mark.parametrize("priv", ["slots", "pages16"])
def test_uniform_prefill_rows_equal_the_request_loop(profile, priv):
    """prefill_time_uniform (the calibration fit's array path) gives what prefill_time gives for the same
    batch of alike requests: odd chunk sizes (partial row tiles), no context, correction on and off."""
    from types import SimpleNamespace

    from granisim.costmodel.tables import CostTables

    t = CostTables(profile, LLAMA)
    assert t.form == 2 and t.corr  # both profiles carry a measured kernel table
    t._priv_class = priv
    q = np.array([1, 7, 16, 65, 513, 2047, 1, 33])
    c = np.array([0, 0, 1, 63, 1025, 16384, 4097, 5])
    n = np.array([1, 3, 4, 1, 2, 1, 7, 255])
    inv = t.prefill_inv_eff(*(("paged", 16) if priv == "pages16" else ("token", 1)))
    for correct in (True, False):
        got = t.prefill_time_uniform(q, c, n, inv, correct=correct)
        want = [t.prefill_time([SimpleNamespace(num_new=int(a), context_len=int(b), shared_len=0, group=-1)] * int(k),
                               inv, [], correct=correct) for a, b, k in zip(q, c, n)]
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_prefill_tile_follows_the_extend_kernels_rule():
    """Form 2 prices a prefill launch in the tiles the extend kernel picks: attn.prefill.m_tile rows (and KV tokens)
    once its longest chunk stacks that many rows per KV head, 64 below (gpu_backend.kernels.extend.default_tiles);
    a short chunk launched with a long one runs the long one's tiles."""
    from types import SimpleNamespace

    from granisim.costmodel.tables import CostTables

    extend = pytest.importorskip("gpu_backend.kernels.extend")
    t = CostTables(H200, LLAMA, use_table=False)
    assert t.pf_mt == 128 and t.G == 4
    for q in (1, 15, 16, 31, 32, 33, 100, 4096):
        assert t.prefill_tile(q) == extend.default_tiles(q * t.G)["block_m"], q
    req = lambda q: SimpleNamespace(num_new=q, context_len=4096, shared_len=0, group=-1)  # noqa: E731
    # 8 rows per KV head: alone in 64-row tiles (one per request), beside a 64-token chunk in 128-row tiles
    alone = t.prefill_time([req(2)] * 8, 1.0, [], correct=False)
    assert alone == pytest.approx(t.prefill_time_uniform(2, 4096, 8, 1.0, correct=False))
    asked = []
    t.prefill_tile = lambda longest: asked.append(longest) or CostTables.prefill_tile(t, longest)
    mixed = t.prefill_time([req(2)] * 8 + [req(64)], 1.0, [], correct=False)
    assert asked == [64] and mixed != alone
    small = CostTables(H200, LLAMA, use_table=False)
    small.pf_mt = 64  # a profile whose kernel has one tile (e.g. a100-80gb's form-1 prefill has no rule)
    assert small.prefill_tile(4096) == 64
