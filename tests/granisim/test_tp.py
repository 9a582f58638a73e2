"""Tensor parallelism and mixture-of-experts pricing in the cost model (granisim/costmodel/parallel.py).

Each test names the bug it catches; the ones marked "planted" were run against the bug (tp ignored in
the shard, in the KV budget or in the all-reduce count; all experts read at every step) and failed.
"""

from dataclasses import replace

import numpy as np
import pytest

from granisim.cli import main
from granisim.config.hardware import get_profile
from granisim.config.models import get_model, kv_budget_tokens
from granisim.config.scenario import parse_scenario
from granisim.core.contract import BatchPlan, PlannedRequest
from granisim.costmodel import CostTables, op_work, roofline_time, step_cost
from granisim.costmodel.parallel import (allreduce_seconds, allreduces_per_step, expected_expert_rows,
                                         expert_pick_probs, moe_layer_work)
from granisim.experiments.run import prepare

SMALL = "[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 5\nrate = 5.0\nmax_output_len = 8\n"


def _decode_plan(n: int, ctx: int = 4096) -> BatchPlan:
    return BatchPlan(0, "token", 1, tuple(PlannedRequest(i, ctx, 1, False) for i in range(n)), ())


# --- the shard -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["llama-3.1-70b", "qwen-2.5-72b", "qwen3-30b-a3b", "llama-3.1-8b"])
@pytest.mark.parametrize("tp", [2, 4])
def test_shard_divides_heads_columns_and_weights(name, tp):
    """Per GPU: query and KV heads / tp, G unchanged, MLP and expert columns / tp, weights ~ / tp (only the
    norms and the MoE router are replicated), KV bytes per token / tp. Planted: shard() returning the model
    unchanged fails every assertion."""
    m = get_model(name)
    s = m.shard(tp)
    assert (s.n_q_heads, s.n_kv_heads, s.group_size) == (m.n_q_heads // tp, m.n_kv_heads // tp, m.group_size)
    assert (s.intermediate, s.expert_intermediate) == (m.intermediate // tp, m.expert_intermediate // tp)
    assert s.kv_bytes_per_token * tp == m.kv_bytes_per_token
    replicated = (m.num_layers * 2 + 1) * m.hidden + m.num_layers * m.hidden * m.num_experts
    assert s.num_params * tp == pytest.approx(m.num_params + (tp - 1) * replicated, rel=1e-4)
    assert s.tp == tp and m.shard(1) is m


def test_shard_refuses_tp_that_does_not_divide_the_kv_heads():
    """Qwen3-30B-A3B has 4 KV heads: tp = 8 would need replicated KV heads, which we do not model."""
    with pytest.raises(ValueError, match="KV heads"):
        get_model("qwen3-30b-a3b").shard(8)
    assert get_model("qwen3-30b-a3b").shard_error(4) is None


# --- KV capacity -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_kv_budget_is_the_replicas_memory_minus_sharded_weights(tp):
    """KV tokens of a tp replica = (one GPU's memory x fraction - its weight shard - reserve) / (its share of a
    token's KV): the replica's memory minus the sharded weights, summed over its GPUs, over a token's KV.
    Planted: prepare() ignoring hardware.tp (the tp = 1 budget) fails."""
    sc = parse_scenario({"model": {"name": "llama-3.1-70b"}, "hardware": {"profile": "h200", "tp": tp}})
    setup = prepare(sc)
    prof, m = get_profile("h200"), get_model("llama-3.1-70b")
    free_replica = tp * (prof.memory_bytes * 0.9 - 4e9) - m.weight_bytes
    want = free_replica / m.kv_bytes_per_token
    assert setup.kv_budget == pytest.approx(want, rel=1e-3)  # replicated norms/router: a few KB off
    assert setup.kv_budget == kv_budget_tokens(m.shard(tp), prof.memory_bytes, 0.9, 4e9)
    assert setup.model.tp == tp


# --- all-reduces -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_linear_part_holds_two_allreduces_per_layer_and_the_embeddings(tp, tokens):
    """The linear part of a tp step = the shard's operators + (2 L + 1) all-reduces of T x hidden activations.
    Planted: pricing one all-reduce per layer, or none (tp ignored in the cost tables), fails."""
    prof = get_profile("h200")
    s = get_model("llama-3.1-70b").shard(tp)
    with_comm = CostTables(prof, s).linear_time(tokens)
    without = CostTables(prof, replace(s, tp=1)).linear_time(tokens)
    one = float(allreduce_seconds(prof, tp, tokens * s.hidden * s.dtype_bytes))
    assert allreduces_per_step(s) == 2 * s.num_layers + 1
    assert with_comm - without == pytest.approx((2 * s.num_layers + 1) * one, rel=1e-9)
    assert one > prof[f"comm.allreduce.tp{tp}.latency_s"]


def test_allreduce_curve_follows_the_bus_bandwidth_formula():
    """t(S) = latency + S 2(n-1)/n / busbw: doubling S adds S 2(n-1)/n / busbw."""
    prof = get_profile("h200")
    for n in (2, 4, 8):
        bw, lat = prof[f"comm.allreduce.tp{n}.busbw"], prof[f"comm.allreduce.tp{n}.latency_s"]
        assert allreduce_seconds(prof, n, 1e6) == pytest.approx(lat + 1e6 * 2 * (n - 1) / n / bw)
    assert allreduce_seconds(prof, 1, 1e6) == 0.0


def test_per_gpu_work_shrinks_with_tp():
    """A decode step at tp = 2 on the same GPU: attention over half the KV heads (about half the time), linear
    operators over half the weights (less than tp = 1 although all-reduces are added). Planted: the cost
    tables pricing the full model for a shard fails."""
    prof = get_profile("h200")
    m = get_model("llama-3.1-8b")
    one, two = step_cost(_decode_plan(64), prof, m), step_cost(_decode_plan(64), prof, m.shard(2))
    r = two.breakdown["attn_decode"] / one.breakdown["attn_decode"]
    assert 0.4 < r < 0.65, r
    assert two.breakdown["linear"] < one.breakdown["linear"]
    assert two.duration_s < one.duration_s


def test_tp1_tables_unchanged_by_the_parallel_terms():
    """tp = 1 dense: the parallel terms add nothing (the golden scenarios check whole runs byte for byte)."""
    t = CostTables(get_profile("h200"), get_model("llama-3.1-8b"))
    assert not t.has_parallel and t.parallel_time(512) == 0.0 and t.logits_gather_time(8) == 0.0


# --- mixture of experts ------------------------------------------------------------------------------------
def test_expected_active_experts_uniform():
    """Uniform top-k of E: E (1 - (1 - k/E)^T) active; one token activates exactly k. Planted: assuming all E
    experts active fails at T = 1."""
    m = get_model("qwen3-30b-a3b")
    E, k = m.num_experts, m.experts_per_token
    for T in (1, 4, 64, 4096):
        active, rows = expected_expert_rows(m, T, 16)
        assert active == pytest.approx(E * (1 - (1 - k / E) ** T))
        assert rows >= T * k - 1e-6
    assert expected_expert_rows(m, 1, 16)[0] == pytest.approx(k)


def test_zipf_routing_activates_fewer_experts():
    """A skewed router keeps its popular experts busy: fewer experts active than uniform at the same T, and a
    token still picks k (probabilities sum to k, none above 1)."""
    m = get_model("qwen3-30b-a3b")
    z = replace(m, expert_routing="zipf", expert_zipf_s=1.2)
    q = expert_pick_probs(z)
    assert q.sum() == pytest.approx(m.experts_per_token) and q.max() <= 1.0
    for T in (8, 64, 512):
        assert expected_expert_rows(z, T, 16)[0] < expected_expert_rows(m, T, 16)[0]


def test_moe_reads_only_active_experts_weights():
    """Expert weight bytes of a 1-token step = k experts' weights, of a 4096-token step ~ all E. Planted: reading
    every expert's weights each step fails the first assertion."""
    m = get_model("qwen3-30b-a3b")
    per_expert = 3 * m.hidden * m.expert_intermediate * m.dtype_bytes
    w1, w4k = moe_layer_work(m, 1, 16), moe_layer_work(m, 4096, 16)
    weights1 = w1["up"][1] + w1["down"][1] - 2 * (1 * 8) * (m.hidden + 1.5 * m.expert_intermediate) * 2
    assert weights1 == pytest.approx(8 * per_expert, rel=1e-6)
    assert w4k["up"][1] > 0.99 * m.num_experts * 2 * m.hidden * m.expert_intermediate * m.dtype_bytes


def test_moe_step_is_priced_by_active_not_total_parameters():
    """A 1-token decode step of Qwen3-30B-A3B (3B active) costs far less linear time than a dense 32B; with the
    batch, its expert reads grow to all experts and the step cost rises. Planted: pricing the experts as one
    dense MLP of E x width fails the first assertion."""
    prof = get_profile("h200")
    moe, dense = get_model("qwen3-30b-a3b"), get_model("qwen-2.5-32b")
    t = CostTables(prof, moe)
    assert t.linear_time(1) < 0.3 * CostTables(prof, dense).linear_time(1)
    assert t.linear_time(1) < t.linear_time(64) < t.linear_time(1024)
    assert np.isfinite(step_cost(_decode_plan(32), prof, moe).duration_s)


# --- bad input ---------------------------------------------------------------------------------------------
BAD = {
    "tp not dividing the KV heads": ("[model]\nname = 'qwen3-30b-a3b'\n[hardware]\nprofile = 'h200'\ntp = 8\n",
                                     "hardware.tp", "8"),
    "tp not a power of two": ("[hardware]\nprofile = 'h200'\ntp = 3\n", "hardware.tp", "3"),
    # catches: the Literal compared by ==, so true ran as tp = 1 and 4.0 as tp = 4 (files are read strictly)
    "tp a boolean": ("[hardware]\nprofile = 'h200'\ntp = true\n", "hardware.tp", "true"),
    "tp a float": ("[hardware]\nprofile = 'h200'\ntp = 4.0\n", "hardware.tp", "4.0"),
    "MoE field on a dense model": ("[model]\nname = 'llama-3.1-8b'\nexpert_routing = 'zipf'\n",
                                   "model.expert_routing", "'zipf'"),
    "zipf exponent with uniform routing": ("[model]\nname = 'qwen3-30b-a3b'\nexpert_zipf_s = 1.5\n"
                                           "[hardware]\nprofile = 'h200'\n", "model.expert_zipf_s", "1.5"),
    "shards that do not fit": ("[model]\nname = 'qwen-2.5-72b'\n[hardware]\nprofile = 'a100-80gb'\ntp = 2\n"
                               "mem_fraction = 0.8\n", "hardware.tp", "2"),
}


@pytest.mark.parametrize("text,field,value", BAD.values(), ids=list(BAD))
def test_bad_tp_and_moe_input_exits_2_naming_file_field_value(tmp_path, capsys, text, field, value):
    path = tmp_path / "bad.toml"
    path.write_text(text + SMALL)
    rc = main(["run", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0] and f"field {field} = {value}" in lines[0], lines[0]


def test_tp_field_is_left_out_of_dumps_at_its_default():
    """Sweep point ids of earlier scenarios (their dumps) do not change; a tp override still applies."""
    sc = parse_scenario({})
    assert "tp" not in sc.model_dump()["hardware"] and "expert_routing" not in sc.model_dump()["model"]
    assert sc.with_changes(**{"hardware.tp": 4}).hardware.tp == 4


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a100_uses_vidurs_tensor_parallel_rows(tp):
    """a100-80gb's table holds Vidur's TP = 2/4/8 per-shard timings of Llama-3-8B: at a measured size the
    shard's linear part is those rows summed over layers (+ the all-reduces), not the TP = 1 rows carried by
    the roofline ratio. Planted: _build_linear_grid ignoring table.tp_ops fails."""
    prof = get_profile("a100-80gb")
    m = get_model("llama-3.1-8b")
    ns, ops = prof.linear_table.tp_ops[tp]
    i = len(ns) - 1  # the largest measured size: not lowered by the table's non-decreasing rule
    layer = sum(ops[c][i] for c in ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                                    "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj"))
    layer += 2 * ops["add"][i]
    want = (m.num_layers * layer + ops["emb"][i] + ops["input_layernorm"][i]) * 1e-3
    t = CostTables(prof, m.shard(tp))
    got = t.linear_time(ns[i]) - float(t.allreduce_time(ns[i]))
    assert got == pytest.approx(want, rel=1e-9)


def test_grouped_gemm_fit_recovers_a_known_roofline(tmp_path):
    """calibration/measure's grouped_gemm.csv -> linear.moe_*: rows made from a known roofline are fitted back
    (held-out error ~0). Planted: fitting the bytes column as FLOPs (swapped) leaves a large held-out error."""
    import csv

    from granisim.calibration.moe_fit import fit_grouped

    P, BW = 989e12, 4.8e12
    with open(tmp_path / "grouped_gemm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["family", "flops", "bytes", "median_us"])
        w.writeheader()
        for fam, (c, ef, em) in (("moe_up", (4e-6, 0.6, 0.8)), ("moe_down", (3e-6, 0.5, 0.7))):
            for T in (1, 4, 16, 64, 256, 1024, 4096, 8192):
                act = 128 * (1 - (1 - 8 / 128) ** T)
                rows = act * max(16, -(-T * 8 / act // 16) * 16)
                fl, by = 2 * rows * 2048 * 1536, 2 * (act * 2048 * 1536 + rows * 3584)
                t = float(roofline_time(fl, by, P, BW, c, ef, em))
                w.writerow(dict(family=fam, flops=fl, bytes=by, median_us=t * 1e6))
    values, errors = fit_grouped(tmp_path, P, BW)
    assert all(e["median"] < 0.02 and e["p90"] < 0.05 for e in errors.values()), errors
    assert values["linear.moe_up.mem_eff"] == pytest.approx(0.8, rel=0.05)


def test_grouped_gemm_check_prices_rows_with_the_profiles_coefficients(tmp_path):
    """moe_fit.profile_errors prices every row of grouped_gemm.csv with the profile's linear.moe_* as they stand:
    rows made from those coefficients check at ~0 error, rows 10% slower at 9.1%. Planted: pricing with moe_up's
    coefficients for moe_down too fails the first assertion."""
    import csv

    from granisim.calibration.moe_fit import profile_errors

    prof = get_profile("h200")
    with open(tmp_path / "grouped_gemm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["family", "flops", "bytes", "median_us"])
        w.writeheader()
        for fam in ("moe_up", "moe_down"):
            c, ef, em = (prof[f"linear.{fam}.{k}"] for k in ("launch_s", "flop_eff", "mem_eff"))
            for T in (1, 64, 4096):
                fl, by = 2 * T * 8 * 2048 * 1536, 2 * (128 * 2048 * 1536 + T * 8 * 3584)
                t = float(roofline_time(fl, by, prof.bf16_flops, prof.hbm_bandwidth, c, ef, em))
                w.writerow(dict(family=fam, flops=fl, bytes=by, median_us=t * 1e6))
    errors = profile_errors(tmp_path, prof)
    assert set(errors) == {"moe_up", "moe_down"} and all(e["median"] < 1e-6 and e["n"] == 3 for e in errors.values())
    rows = list(csv.DictReader(open(tmp_path / "grouped_gemm.csv")))
    with open(tmp_path / "grouped_gemm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "median_us": float(r["median_us"]) * 1.1} for r in rows)
    assert all(e["median"] == pytest.approx(1 - 1 / 1.1) for e in profile_errors(tmp_path, prof).values())


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_m_sat_moves_up_with_tp(tp):
    """M_eff per KV head is unchanged by tp, but a GPU holds n_kv / tp heads: the dense pass launches fewer CTAs,
    so the cost model's dense/cascade crossover at a 16K prefix moves up, and a tp scenario's default M_sat is
    the profile's per-tp value. Planted: prepare() using the tp = 1 m_sat fails the last assertion."""
    from granisim.costmodel import m_sat_threshold

    prof, m = get_profile("h200"), get_model("llama-3.1-8b")
    assert m_sat_threshold(prof, m.shard(tp), 16384) > m_sat_threshold(prof, m, 16384)
    sc = parse_scenario({"model": {"name": "llama-3.1-70b"}, "hardware": {"profile": "h200", "tp": tp}})
    assert prepare(sc).m_sat == int(prof[f"m_sat.tp{tp}"]) > prof.m_sat


def test_shard_check_prices_the_shards_as_the_cost_model_does(tmp_path):
    """moe_fit.shard_errors' ``table`` errors are the cost model's own pricing of each per-shard GEMM: timings
    made from it score 0, the roofline families do not. Planted: pricing the unsharded model fails."""
    import csv
    import json

    from granisim.calibration.moe_fit import TABLE_COLUMN, shard_errors
    from granisim.costmodel.tables import carried_s, nearest_linear_table

    prof, m = get_profile("h200"), get_model("llama-3.1-70b")
    (tmp_path / "meta.json").write_text(json.dumps({"model": m.name}))
    with open(tmp_path / "linear_tp.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["tp", "family", "n", "flops", "bytes", "median_us"])
        w.writeheader()
        for tp in (2, 8):
            ns, ops, ref = nearest_linear_table(prof, m.shard(tp))
            for fam, col in TABLE_COLUMN.items():
                t = carried_s(ops[col], fam, np.asarray(ns, float), ref, m.shard(tp), prof.bf16_flops,
                              prof.hbm_bandwidth)
                fl, by = op_work(fam, np.asarray(ns, float), m.shard(tp))
                for n, ti, fi, bi in zip(ns, t, fl, by):
                    w.writerow(dict(tp=tp, family=fam, n=n, flops=fi, bytes=bi, median_us=ti * 1e6))
    errs = shard_errors(tmp_path, prof)
    assert set(errs) == {2, 8}
    for e in errs.values():
        assert e["table"]["median"] < 1e-9 and e["table"]["p90"] < 1e-9 and e["table"]["n"] == 4 * 27
        assert e["roofline"]["median"] > 0.01


@pytest.mark.parametrize("s", [300.0, 1000.0, 1e300])
def test_a_steep_zipf_router_picks_the_k_most_popular_experts(s):
    """catches: with expert_zipf_s = 1000 every expert's popularity past the first underflowed to 0, the capped
    excess was shared out as 0 / 0, and every MoE step (and the run's throughput) came out NaN."""
    m = get_model("qwen3-30b-a3b")
    q = expert_pick_probs(replace(m, expert_routing="zipf", expert_zipf_s=s))
    k = m.experts_per_token
    assert np.isfinite(q).all() and q.sum() == pytest.approx(k) and q.max() <= 1.0
    assert q[:k] == pytest.approx(np.ones(k)) and q[k:].sum() == pytest.approx(0.0, abs=1e-9)
    active, rows = expected_expert_rows(replace(m, expert_routing="zipf", expert_zipf_s=s), 100, 16)
    assert active == pytest.approx(k) and np.isfinite(rows)
