"""The host time of a step the engine builds in full (granisim.costmodel.host_build): which steps repeat the one
before (rows_repeat.py's rule on the plans alone), and the executor, the step-by-step pricing and a fast-forward
block all charging it on the same steps. Planted bugs caught: a repeat that ignores the groups, a block cut short
that forgets its first step's full build, the executor charging every step (seen failing, removed)."""
import pytest

from granisim.calibration.engine_fit import host_work, with_engine
from granisim.config.hardware import Source, get_profile
from granisim.config.models import get_model
from granisim.core.contract import KVCopy, PrefixGroup, batch_plan, planned_request, with_steps
from granisim.costmodel import step_cost
from granisim.costmodel.executor import CostExecutor
from granisim.costmodel.host_build import repeats

REBUILD = 1e-3
MODEL = get_model("llama-3.1-8b")


def _plan(step, rids, ctx=100, prefill=(), groups=(), copies=(), num_steps=1):
    reqs = tuple(planned_request(r, 0 if r in prefill else ctx + step, ctx if r in prefill else 1, r in prefill)
                 for r in rids)
    return batch_plan(step, "granikv", 1, reqs, groups, copies, num_steps)


def _group(members, prefix_len=64):
    return (PrefixGroup(key=1, prefix_len=prefix_len, storage="slab", path="cascade", members=members,
                        m_eff=4 * len(members)),)


def test_a_step_repeats_the_one_before_only_with_the_same_decoding_requests_and_groups():
    a = _plan(1, [1, 2, 3])
    assert repeats(a, _plan(2, [1, 2, 3]))
    assert not repeats(None, a)
    assert not repeats(a, _plan(2, [1, 3, 2]))  # another order: other rows
    assert not repeats(a, _plan(2, [1, 2]))  # a request left
    assert not repeats(a, _plan(2, [1, 2, 3, 4]))  # one joined
    assert not repeats(_plan(1, [1, 2, 3], prefill={3}), _plan(2, [1, 2, 3]))  # after a prefill
    assert not repeats(a, _plan(2, [1, 2, 3], prefill={2}))
    assert not repeats(a, _plan(2, [1, 2, 3], copies=(KVCopy(0, 10, 4),)))  # KV moved: rows rebuilt
    grouped = _plan(1, [1, 2, 3], groups=_group((0, 1)))
    assert repeats(grouped, _plan(2, [1, 2, 3], groups=_group((0, 1))))
    assert not repeats(grouped, _plan(2, [1, 2, 3], groups=_group((0, 1, 2))))
    assert not repeats(grouped, _plan(2, [1, 2, 3], groups=_group((0, 1), prefix_len=128)))


@pytest.fixture(scope="module")
def profiles():
    shipped, source = get_profile("h200-engine"), Source("measured", note="test")
    return (with_engine(shipped, {"overhead.rebuild_s": 0.0}, source),
            with_engine(shipped, {"overhead.rebuild_s": REBUILD}, source))


def _extra(plans, base, prof):
    """Per plan: what the executor charges with the rebuild term, over what it charges without it."""
    a, b = CostExecutor(base, MODEL), CostExecutor(prof, MODEL)
    return [pytest.approx(b.execute(p).duration_s - a.execute(p).duration_s, abs=1e-12) for p in plans]


def test_the_executor_and_the_step_by_step_pricing_charge_the_full_builds(profiles):
    base, prof = profiles
    plans = [_plan(0, [1, 2], prefill={1, 2}), _plan(1, [1, 2]), _plan(2, [1, 2]), _plan(3, [1, 2, 3], prefill={3}),
             _plan(4, [1, 2, 3]), _plan(5, [1, 2, 3]), _plan(6, [1, 3])]
    charged = [REBUILD, REBUILD, 0.0, REBUILD, REBUILD, 0.0, REBUILD]
    assert _extra(plans, base, prof) == charged
    after = [None, *plans[:-1]]
    assert [step_cost(p, prof, MODEL, q).duration_s - step_cost(p, base, MODEL, q).duration_s
            for q, p in zip(after, plans)] == pytest.approx(charged, abs=1e-12)
    assert [host_work(p, q)["rebuilds"] for q, p in zip(after, plans)] == [bool(c) for c in charged]
    res = CostExecutor(prof, MODEL)
    first = res.execute(plans[0])
    assert first.breakdown["overhead"] == pytest.approx(CostExecutor(base, MODEL).execute(plans[0]).breakdown
                                                        ["overhead"] + REBUILD)


def test_a_fast_forward_block_charges_its_first_step_once_also_when_cut_short(profiles):
    base, prof = profiles
    start, block = _plan(0, [1, 2], prefill={1, 2}), with_steps(_plan(1, [1, 2]), 8)
    cut = with_steps(block, 3)  # the serving loop prices the block, then its first 3 steps
    assert _extra([start, block, cut], base, prof) == [REBUILD, REBUILD, REBUILD]
    ex = CostExecutor(prof, MODEL)
    for p in (start, block):
        ex.execute(p)
    steps = ex.execute(cut).step_durations
    plain = CostExecutor(base, MODEL)
    for p in (start, block):
        plain.execute(p)
    assert [a - b for a, b in zip(steps, plain.execute(cut).step_durations)] == pytest.approx([REBUILD, 0, 0])
    # the plan after the block, same requests: derived from it
    assert _extra([start, block, cut, _plan(4, [1, 2])], base, prof)[-1] == 0.0


def test_profiles_without_the_term_price_as_before(profiles):
    base, _ = profiles
    p = _plan(1, [1, 2])
    assert step_cost(p, base, MODEL, None) == step_cost(p, base, MODEL, p) == CostExecutor(base, MODEL).execute(p)
