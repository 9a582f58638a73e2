"""Row regions and padded metadata of a step (host side, no torch kernels): the contract that lets
one CUDA graph replay every step of the same shape."""

import numpy as np
import pytest

from gpu_backend.executor import rows as R
from granisim.core.serving_loop import ServingLoop
from granisim.core.contract import StepResult
from granisim.config.scenario import parse_scenario
from granisim.experiments.run import prepare


def test_buckets_cover_and_pad_less_than_half():
    for n in range(1, 5000):
        b = R.bucket(n)
        assert n <= b < max(1.5 * n, 8.5), n
        assert R.bucket(b) == b  # a bucket is its own bucket: shapes are stable
        assert n <= R.bucket_len(n) < n + max(256, n / 4), n
    assert R.bucket(0) == R.bucket_len(0) == 0


class _Recorder:
    """Stands in for the GPU executor: records each plan's host step, returns dummy tokens."""

    needs_layouts = True
    max_steps_per_plan = 1

    def __init__(self, num_slots):
        self.num_slots = num_slots
        self.steps = []

    def execute(self, plan):
        host = R.build(plan, self.num_slots)
        self.steps.append((plan, host))
        return StepResult(1e-3, {}, {r.rid: 1 for r in plan.requests})


@pytest.fixture(scope="module", params=["granikv", "token", "paged16"])
def recorded(request):
    sc = parse_scenario({
        "name": "rows", "seed": 3, "model": {"name": "tiny"}, "hardware": {"kv_budget_tokens": 8192},
        "policy": {"name": request.param, "m_sat": 24, "hot_fraction": 0.4},  # both passes in some steps
        "scheduler": {"max_batch_tokens": 512, "fast_forward": False},
        "workload": {"roles": 3, "prefix_len": 48, "num_requests": 80, "rate": 2000.0, "suffix_scale": 0.02,
                     "max_output_len": 12},
    })
    setup = prepare(sc)
    rec = _Recorder(setup.kv_budget)
    ServingLoop(setup, rec, progress=False).run()
    return rec


def _sizes_from_shape(s: R.StepShape) -> list[int]:
    """The fixed-size fields' sizes as a function of the shape alone (the graph-replay contract)."""
    lens = 1 if s.page_size else 0  # page tables (the paged policy) add a length per sequence
    out = [s.num_rows] * 3 + [s.sample_rows, s.ext_reqs + 1, s.ext_reqs + 1] + [s.ext_reqs] * lens
    out += [s.dec_rows + 1] + [s.dec_rows] * lens
    for p in s.passes:
        out += [p.groups + 1] + ([p.groups, p.groups] if p.slab else [p.groups + 1])
    return out + [s.grouped_rows + 1]


def test_field_sizes_depend_on_the_shape_alone(recorded):
    for _, host in recorded.steps:
        assert [a.size for a in host.small] == _sizes_from_shape(host.shape), host.shape
        want = {"ext", "dec", "suffix"} | {f"pass{n}" for n, p in enumerate(host.shape.passes) if not p.slab}
        assert set(host.big) == want


def test_every_request_gets_its_rows_and_one_sampled_row(recorded):
    for plan, host in recorded.steps:
        tokens, positions, new_slots, sample = host.small[:4]
        s = host.shape
        assert tokens.size == positions.size == new_slots.size == s.num_rows
        assert sample.size == s.sample_rows
        assert set(host.sample_of) == {r.rid for r in plan.requests}
        real = new_slots != recorded.num_slots
        assert real.sum() == plan.num_tokens  # pads write to the scratch slot only
        want = np.sort(np.concatenate([r.new_slots for r in plan.requests]))
        assert np.array_equal(np.sort(new_slots[real]), want)
        for r in plan.requests:  # the sampled row feeds the request's last new token
            row = sample[host.sample_of[r.rid]]
            assert new_slots[row] == r.new_slots[-1] and tokens[row] == r.input_tokens[-1]
            assert positions[row] == r.context_len + r.num_new - 1


def test_grouped_rows_read_their_own_suffix(recorded):
    for plan, host in recorded.steps:
        s = host.shape
        new_slots, suffix_ptr = host.small[2], host.small[-1]
        by_slot = {int(r.new_slots[-1]): r for r in plan.requests}
        g0 = s.ext_rows + s.dec_rows
        for j in range(s.grouped_rows):
            n = suffix_ptr[j + 1] - suffix_ptr[j]
            slot = int(new_slots[g0 + j])
            if slot == recorded.num_slots:
                assert n == 0  # a pad row reads nothing
            else:
                r = by_slot[slot]
                assert n == r.kv_len - plan.groups[r.group].prefix_len, (plan.step, r.rid)


def test_paged_contexts_are_read_through_the_page_table(recorded):
    """paged policy: each extend request's cached context, rebuilt from its page ids and length, is exactly
    its first context_len slots (the extend kernel reads it page by page, as decode does)."""
    plan0 = recorded.steps[0][0]
    if plan0.policy != "paged":
        pytest.skip("page tables are the paged policy's")
    ps, seen = plan0.page_size, 0
    for plan, host in recorded.steps:
        page_ptr, lens, pages = host.small[5], host.small[6], host.big["ext"]
        for n, r in enumerate(r for r in plan.requests if r.is_prefill):
            ids = pages[page_ptr[n]: page_ptr[n + 1]]
            rebuilt = (ids[:, None] * ps + np.arange(ps)).ravel()[: lens[n]]
            assert np.array_equal(rebuilt, r.layout.slots()[: r.context_len]), (plan.step, r.rid)
            seen += r.context_len > 0
    assert seen  # some chunk had a cached context


def test_eager_steps_are_not_padded(recorded):
    for plan, _ in recorded.steps[:40]:
        host = R.build(plan, recorded.num_slots, pad=False)
        assert host.shape.num_rows == plan.num_tokens
        assert (host.small[2] != recorded.num_slots).all()  # no pad row, no scratch write


def test_paths_seen(recorded):
    kinds = {(p.path, p.slab) for _, h in recorded.steps for p in h.shape.passes}
    if recorded.steps[0][0].policy == "granikv":
        assert ("dense", True) in kinds and any(h.shape.ext_rows for _, h in recorded.steps)
        assert any(len(h.shape.passes) > 1 for _, h in recorded.steps)  # pads between passes


def _fit_steps(rng, n, tokens, scale):
    """Synthetic steps.parquet rows of one size: every key measured at ``scale`` x its prediction."""
    import pandas as pd

    from granisim.costmodel import ENGINE_KEYS

    pred = rng.uniform(1e-3, 2e-1, n)
    batch = rng.integers(1, 64, n)
    df = pd.DataFrame({"tokens": np.full(n, tokens), "batch": batch, "kv_tokens": 0, "passes": 0,
                       "rebuilds": 0, "decode_launches": 1, "measured_overhead": 5e-4 + 1e-5 * batch, "predicted_overhead": 1e-3})
    for k in ENGINE_KEYS:
        df[f"predicted_{k}"] = pred
        df[f"measured_{k}"] = scale * pred * rng.normal(1.0, 0.002, n)
    return df


def test_engine_calibration_knows_the_graph_limit(tmp_path):
    """The CUDA-graph limit travels from the executor that ran the steps to the price of a step: the executor's
    stats carry its own limit (700 rows here, neither the default 2048 nor the other known limit, 512), the
    validation report reads it from the run's stats, the fit splits the steps there (600-token steps measured at
    1.1x the model, 900-token ones at 1.8x) and records it, and the fitted profile prices a 700-token plan with
    the graph set and a 701-token plan with the eager set. Planted bugs: stats() reporting the GRAPH_MAX_ROWS
    constant, the report taking a constant limit (2048: the 900-token steps join the graph set), the fit
    splitting at 2048 whatever it is given, and the cost model's ``T > graph_max`` written ``T >= graph_max``
    each fail here."""
    import json

    import pandas as pd
    import torch

    from gpu_backend.executor import GpuExecutor
    from gpu_backend.executor.graphs import GraphCache
    from granisim.calibration.engine_fit import fit, with_engine
    from granisim.config.hardware import Source, get_profile
    from granisim.config.models import get_model
    from granisim.core.contract import BatchPlan, PlannedRequest
    from granisim.costmodel import step_cost
    from granisim.validation.report import graph_limit

    limit = 700
    ex = GpuExecutor(get_model("tiny"), 64, device="cpu", graph_max_rows=limit)
    ex.graphs = GraphCache(torch.device("cpu"))  # as on a GPU (graphs on); no step is run, only stats() read
    stats = ex.stats()
    assert stats["graph_max_rows"] == limit
    run = tmp_path / "run"
    run.mkdir()
    rng = np.random.default_rng(0)
    graph, eager = _fit_steps(rng, 200, 600, 1.1), _fit_steps(rng, 120, 900, 1.8)
    steps = pd.concat([graph, eager], ignore_index=True)
    stats["eager_steps"] = int((steps.tokens > limit).sum())
    (run / "validation_control_short.json").write_text(json.dumps({"executor": stats}))
    got = graph_limit(run, ["control_short"], {"control_short": steps})
    assert got == limit

    vals = fit([steps], got)
    assert vals["engine.graph_max_tokens"] == limit
    assert vals["engine.lm_head.scale"] == pytest.approx(1.1, rel=0.01)
    assert vals["engine.eager.lm_head.scale"] == pytest.approx(1.8, rel=0.01)
    base, model = get_profile("h200"), get_model("llama-3.1-8b")
    fitted = with_engine(base, vals, Source("measured"))

    def lm_head_time(prefill_tokens, profile):  # one prefill chunk plus a decode: the step's LM head
        plan = BatchPlan(0, "token", 1, (PlannedRequest(0, 0, prefill_tokens - 1, True),
                                          PlannedRequest(1, 3000, 1, False)))
        assert plan.num_tokens == prefill_tokens
        return step_cost(plan, profile, model).breakdown["lm_head"]

    for tokens, scale in ((limit, "engine.lm_head"), (limit + 1, "engine.eager.lm_head")):
        want = vals[f"{scale}.scale"] * lm_head_time(tokens, base) + vals[f"{scale}.offset_s"]
        assert lm_head_time(tokens, fitted) == pytest.approx(want, rel=1e-9), tokens
