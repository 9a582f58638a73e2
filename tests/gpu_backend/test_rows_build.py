"""`rows.build` (ids collected per request as views, each field one concatenation, range-checked as it is made)
against `rows_reference.build_reference` (the per-request construction it replaced): the same shape, the same
int32 fields byte for byte, the same sampled rows, and the same ValueError on a bad plan. Also the arena's
upload: what the launches read through the views (made once per shape and generation) is the step just
uploaded."""
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_backend.executor import metadata
from gpu_backend.executor import rows as R
from gpu_backend.executor.arena import MetaArena
from gpu_backend.executor.rows_reference import build_reference
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup
from granisim.kv.layout import KVSegment, RequestLayout

NUM_SLOTS = 400


def outcome(build, plan, num_slots, pad):
    """What `build` makes of the plan: ('ok', HostStep) or ('error', type name, message)."""
    try:
        return ("ok", build(plan, num_slots, pad))
    except (ValueError, IndexError) as e:  # the reference's own numpy errors on rows the buckets cannot hold
        return ("error", type(e).__name__, str(e))


def assert_same(got, want):
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert got[1:] == want[1:]
        return
    a, b = got[1], want[1]
    assert a.shape == b.shape
    assert len(a.small) == len(b.small)
    for n, (x, y) in enumerate(zip(a.small, b.small)):
        assert x.dtype == y.dtype == np.int32 and np.array_equal(x, y), (n, x, y)
    assert list(a.big) == list(b.big)
    for k in a.big:
        assert a.big[k].dtype == b.big[k].dtype == np.int32 and np.array_equal(a.big[k], b.big[k]), k
    assert list(a.sample_of.items()) == list(b.sample_of.items())


@st.composite
def layouts(draw, n_tokens: int):
    """A layout of `n_tokens` slot ids in 1-3 segments; the first may be a HOT slab (marked, consecutive ids),
    sometimes shorter or longer than the group's `prefix`."""
    cuts = sorted(draw(st.lists(st.integers(0, n_tokens), max_size=2)))
    bounds = [0, *cuts, n_tokens]
    segs = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        if k == 0 and b > a and draw(st.booleans()):
            start = draw(st.integers(0, NUM_SLOTS - (b - a)))
            segs.append(KVSegment("hot", np.arange(start, start + b - a, dtype=np.int64), (start, b - a)))
        else:
            ids = draw(st.lists(st.integers(0, NUM_SLOTS - 1), min_size=b - a, max_size=b - a))
            segs.append(KVSegment("cold", np.array(ids, np.int64)))
    return segs


@st.composite
def plans(draw):
    n = draw(st.integers(0, 9))
    reqs, seg_of = [], []
    for rid in range(n):
        prefill = draw(st.booleans())
        ctx = draw(st.integers(0, 40))
        new = draw(st.integers(1, 6)) if prefill else draw(st.sampled_from([1, 1, 1, 2]))
        segs = draw(layouts(ctx + new))
        reqs.append([rid * 7 + 3, ctx, new, prefill, segs])
    # prefix groups over decode requests: a prefix pass (cascade / dense) or none (paged)
    decode = [i for i, r in enumerate(reqs) if not r[3]]
    groups = []
    free = list(decode)
    while free and draw(st.booleans()):
        k = draw(st.integers(1, len(free)))
        members, free = free[:k], free[k:]
        plen = draw(st.integers(0, min(reqs[i][1] + reqs[i][2] for i in members)))
        path = draw(st.sampled_from(["cascade", "cascade", "dense", "paged"]))
        groups.append(PrefixGroup(len(groups), plen, "slab", path, tuple(members), len(members) * 4))
    planned = []
    for i, (rid, ctx, new, prefill, segs) in enumerate(reqs):
        lay = RequestLayout(rid, tuple(segs), ctx + new, 0, None)
        tokens = np.array(draw(st.lists(st.integers(0, 999), min_size=new, max_size=new)), np.int32)
        slots = lay.slots()[ctx:]
        grp = next((g for g, gr in enumerate(groups) if i in gr.members), -1)
        planned.append(PlannedRequest(rid, ctx, new, prefill, grp, 0, slots, tokens, lay))
    policy = draw(st.sampled_from(["granikv", "token", "paged"]))
    page = draw(st.sampled_from([1, 3, 4, 16])) if policy == "paged" else 1  # 3: the one that is no power of two
    return BatchPlan(draw(st.integers(0, 99)), policy, page, tuple(planned), tuple(groups))


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(plan=plans(), pad=st.booleans())
def test_build_matches_the_per_request_construction(plan, pad):
    """Random plans (prefill chunks over cached contexts, decodes, cascade / dense / paged groups over slab or
    listed prefixes, page tables, multi-token decodes that overflow their bucket): `build` returns what the
    reference returns, or raises what it raises. Planted bugs each caught within the 300 examples: a grouped
    row's suffix read from `prefix_len + 1` (in `_tail`), the extend prefix gathered without skipping the
    previous request's new tokens (`skip` = 0), the positions of a multi-token request all set to its context
    length, and the pages of a page table taken every `page_size - 1` ids."""
    assert_same(outcome(R.build, plan, NUM_SLOTS, pad), outcome(build_reference, plan, NUM_SLOTS, pad))


@SETTINGS
@given(plan=plans(), pad=st.booleans(), where=st.integers(0, 10 ** 6),
       bad=st.sampled_from([-1, NUM_SLOTS, NUM_SLOTS + 5, 2 ** 40]))
def test_a_bad_id_raises_as_the_reference_does(plan, pad, where, bad):
    """One id of the plan set outside the buffer (a KV write slot, or a slot of any layout, read or not): the
    same ValueError (or none, for a slot no step reads) from both. Planted bugs caught: the new slots left out of
    the range check, and a check by `max() > num_slots` (an id equal to the buffer's size passing)."""
    ids = [r.new_slots for r in plan.requests] + [s.slots for r in plan.requests for s in r.layout.segments]
    ids = [a for a in ids if a.size]
    if not ids:
        return
    a = ids[where % len(ids)]
    a[where % a.size] = bad  # the plan's arrays are its own: this plan only
    assert_same(outcome(R.build, plan, NUM_SLOTS, pad), outcome(build_reference, plan, NUM_SLOTS, pad))


@SETTINGS
@given(plan=plans(), pad=st.booleans(), where=st.integers(0, 10 ** 6),
       bad=st.sampled_from([-1, NUM_SLOTS, 2 ** 40]))
def test_large_pieces_match_the_reference(plan, pad, where, bad):
    """The path of the engine's long contexts (pieces of thousands of ids: each range-checked on its own, then
    copied once, cast to int32 on the way), taken here by every piece (`_PIECE_IDS` 1): the same fields as the
    reference, then the same ValueError once an id is set outside the buffer. Planted bugs caught: the first
    piece left out of the check, and the pieces concatenated in reverse."""
    with mock.patch.object(R, "_PIECE_IDS", 1):
        assert_same(outcome(R.build, plan, NUM_SLOTS, pad), outcome(build_reference, plan, NUM_SLOTS, pad))
        ids = [r.new_slots for r in plan.requests] + [s.slots for r in plan.requests for s in r.layout.segments]
        ids = [a for a in ids if a.size]
        if ids:
            a = ids[where % len(ids)]
            a[where % a.size] = bad  # the plan's arrays are its own: this plan only
            assert_same(outcome(R.build, plan, NUM_SLOTS, pad), outcome(build_reference, plan, NUM_SLOTS, pad))


def test_recorded_plans_match_the_reference(recorded_plans):
    for plan, num_slots in recorded_plans:
        for pad in (True, False):
            assert_same(outcome(R.build, plan, num_slots, pad), outcome(build_reference, plan, num_slots, pad))


@pytest.fixture(scope="module")
def recorded_plans():
    """Every plan of a small multi-agent run under each policy, from the real scheduler and allocator."""
    from granisim.config.scenario import parse_scenario
    from granisim.core.contract import StepResult
    from granisim.core.serving_loop import ServingLoop
    from granisim.experiments.run import prepare

    out = []
    for policy in ("granikv", "token", "paged16"):
        sc = parse_scenario({
            "name": "rows", "seed": 5, "model": {"name": "tiny"}, "hardware": {"kv_budget_tokens": 8192},
            "policy": {"name": policy, "m_sat": 24, "hot_fraction": 0.4},
            "scheduler": {"max_batch_tokens": 512, "fast_forward": False},
            "workload": {"roles": 3, "prefix_len": 48, "num_requests": 60, "rate": 2000.0, "suffix_scale": 0.02,
                         "max_output_len": 12},
        })
        setup = prepare(sc)

        class Recorder:
            needs_layouts = True
            max_steps_per_plan = 1

            def execute(self, plan):
                out.append((plan, setup.kv_budget))
                return StepResult(1e-3, {}, {r.rid: 1 for r in plan.requests})

        ServingLoop(setup, Recorder(), progress=False).run()
    return out


def test_uploaded_views_read_the_step_just_uploaded(recorded_plans):
    """The views the launches read (made once per shape and arena generation, metadata.upload) hold each step's
    own fields after its upload, for every recorded step in turn; then again after every buffer has grown.
    Planted bugs caught: the memo kept across a growth (views into the retired buffers), and the memo keyed by
    the fields' total size instead of the shape."""
    arena = MetaArena(torch.device("cpu"))
    metas = {}
    for again in (False, True):
        if again:  # every buffer moves: each shape's views must be made anew
            for name in list(arena._dev):
                arena._grow(name, 2 * arena._dev[name].numel())
        for plan, num_slots in recorded_plans:
            host = R.build(plan, num_slots)
            if not arena.fits(host):
                arena.reserve(host)
            meta = metadata.upload(host, arena)
            got = [meta.tokens, meta.positions, meta.new_slots, meta.sample_rows, meta.extend_indptr]
            for want, t in zip(host.small, got):
                assert np.array_equal(t.numpy(), want)
            suffix = host.big["suffix"]
            assert np.array_equal(meta.suffix_kv.indices[: suffix.size].numpy(), suffix)
            assert np.array_equal(meta.suffix_kv.indptr.numpy(), host.small[-1])
            assert [p.shape for p in meta.passes] == list(host.shape.passes)
            assert metas.setdefault((arena.generation, host.shape), meta) is meta  # one per shape and generation


def test_staged_fixed_fields_reach_the_device_only_through_copy_small(recorded_plans):
    """A CUDA-graph step's fixed-size fields are staged by the upload and copied by the graph's first node
    (`MetaArena.copy_small`): after a staging upload the device still holds the previous step's fields, and after
    `copy_small(meta.small_ids)` exactly this step's; the variable-length lists are copied by the upload itself.
    Planted bugs caught: the staging upload copying anyway, `small_ids` counting one field short."""
    arena = MetaArena(torch.device("cpu"))
    previous = None
    for plan, num_slots in recorded_plans[:40]:
        host = R.build(plan, num_slots)
        if not arena.fits(host):
            arena.reserve(host)
            previous = None
        meta = metadata.upload(host, arena, small_later=True)
        want = np.concatenate(host.small)
        dev = arena._dev["small"][: want.size].numpy()
        if previous is not None and previous.size >= want.size and not np.array_equal(previous[: want.size], want):
            assert not np.array_equal(dev, want), "the fixed fields were copied before copy_small"
        suffix = host.big["suffix"]
        assert np.array_equal(meta.suffix_kv.indices[: suffix.size].numpy(), suffix)
        arena.copy_small(meta.small_ids)
        assert meta.small_ids == want.size
        assert np.array_equal(arena._dev["small"][: want.size].numpy(), want)
        previous = arena._dev["small"].numpy().copy()
