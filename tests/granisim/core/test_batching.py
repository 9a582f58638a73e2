"""The batch builder and its dispatch rule on hand-made work lists.

Every test was shown to fail with the bug its docstring names planted in
``granisim/core/batching.py`` (then removed).
"""

from __future__ import annotations

import pytest

from granisim.core.batching import BatchBuilder, choose_path
from granisim.core.request import Request
from granisim.kv import make_allocator
from tests.granisim.core.states import spec

G, M_SAT, L = 4, 16, 64


def path(b: int, storage: str = "slab", policy: str = "granikv", dispatch: str = "threshold", **kw) -> str:
    return choose_path(policy, dispatch, L, b, storage, group_size=G, m_sat=M_SAT, **kw)


@pytest.mark.parametrize("b, expected", [(3, "cascade"), (4, "dense"), (5, "dense")])
def test_threshold_takes_dense_from_m_sat_on(b, expected):
    """M_eff = b * G = 12, 16, 20 against m_sat = 16: below, equal, above.
    catches: `>` for `>=`; m_sat compared with the member count b instead of M_eff."""
    assert path(b) == expected


@pytest.mark.parametrize("storage", ["cold", "token", "paged"])
def test_threshold_needs_a_slab_for_dense(storage):
    """catches: the storage ignored (dense over a prefix that is not one contiguous run)."""
    assert path(100, storage) == "cascade"


@pytest.mark.parametrize("dispatch", ["threshold", "cost", "auto", "cascade", "dense"])
@pytest.mark.parametrize("policy", ["token", "paged"])
def test_baselines_have_no_prefix_pass(policy, dispatch):
    """catches: the policy check dropped (a prefix pass planned for a baseline)."""
    assert path(100, policy=policy, dispatch=dispatch, path_chooser=lambda *a, **k: "dense") == "paged"


def test_forced_dispatch():
    """catches: forced dense on a non-slab prefix; forced cascade falling through to the threshold rule."""
    assert [path(1, "slab", dispatch="dense"), path(100, "cold", dispatch="dense")] == ["dense", "cascade"]
    assert [path(100, s, dispatch="cascade") for s in ("slab", "cold")] == ["cascade", "cascade"]


def test_cost_dispatch_asks_the_cost_model_and_keeps_dense_on_slabs():
    """The chooser gets (prefix_len, members, storage); its dense answer stands on a slab and becomes
    cascade elsewhere. catches: dense taken on cold storage; the chooser's answer ignored."""
    calls = []

    def chooser(*args):
        calls.append(args)
        return "dense"

    assert [path(2, "slab", dispatch="cost", path_chooser=chooser),
            path(2, "cold", dispatch="cost", path_chooser=chooser)] == ["dense", "cascade"]
    assert calls == [(L, 2, "slab"), (L, 2, "cold")]


def test_auto_dispatch_passes_private_length_and_the_paged_option():
    """catches: dense taken on cold storage under auto; allow_paged or the private length not passed on."""
    calls = []

    def chooser(prefix_len, b, storage, private, allow_paged):
        calls.append((prefix_len, b, storage, private, allow_paged))
        return "dense" if allow_paged else "paged"

    assert path(3, "cold", dispatch="auto", path_chooser=chooser, private=7) == "cascade"
    assert path(3, "slab", dispatch="auto", path_chooser=chooser, private=7, allow_paged=False) == "paged"
    assert calls == [(L, 3, "cold", 7, True), (L, 3, "slab", 7, False)]


@pytest.mark.parametrize("dispatch", ["cost", "auto"])
def test_a_cost_dispatch_without_the_cost_model_is_refused(dispatch):
    """catches: a cost dispatch accepted without its cost model (it would fail at the first group)."""
    with pytest.raises(ValueError, match="needs a path_chooser"):
        BatchBuilder("granikv", G, M_SAT, dispatch)


# ---- building a plan ------------------------------------------------------------------------------
def request(rid: int, group=None, computed: int = 40, decoding: bool = True) -> Request:
    r = Request(spec(rid, prompt=60))
    r.computed, r.decoding, r.group = computed, decoding, group
    return r


def test_build_groups_decoding_members_of_one_prefix():
    """Requests 1, 2 (node 7, slab) decode: one group; request 3 (node 9) is alone; request 4 shares node 7
    but is prefilling. catches: a lone request given a group; a prefill grouped; M_eff without G."""
    alloc = make_allocator("granikv", 1000)
    work = [(request(1, (7, 32, "slab")), 1, None), (request(2, (7, 32, "slab"), 50), 1, None),
            (request(3, (9, 32, "slab")), 1, None), (request(4, (7, 32, "slab"), 10, decoding=False), 5, None)]
    plan = BatchBuilder("granikv", G, m_sat=8).build(work, alloc, step_id=12)
    assert (plan.step, plan.policy, plan.page_size, plan.copies) == (12, "granikv", 1, ())
    (g,) = plan.groups
    assert (g.key, g.prefix_len, g.storage, g.path, g.members, g.m_eff) == (7, 32, "slab", "dense", (0, 1), 8)
    assert [(p.rid, p.context_len, p.num_new, p.is_prefill, p.group, p.shared_len) for p in plan.requests] == [
        (1, 40, 1, False, 0, 32), (2, 50, 1, False, 0, 32), (3, 40, 1, False, -1, 0), (4, 10, 5, True, -1, 0)]
    assert plan.num_tokens == 8


def _auto(chooser, pricer):
    work = [(request(1, (7, 32, "slab"), 40), 1, None), (request(2, (7, 32, "slab"), 50), 1, None)]
    return BatchBuilder("granikv", G, M_SAT, "auto", chooser, pricer).build(work, make_allocator("granikv", 1000), 1)


def test_auto_weighs_the_members_own_tokens():
    """Members hold 40 and 50 tokens over a 32-token prefix: 13 own tokens on average.
    catches: the whole context passed as the private length."""
    seen = []
    _auto(lambda L, b, st, private, allow_paged: seen.append(private) or "cascade", None)
    assert seen == [13]


def test_auto_keeps_the_cheapest_whole_step():
    """Per group the chooser says cascade; the whole step without a prefix pass is priced cheaper and wins;
    on a tie the per-group choice stays. catches: `<=` for `<` (a tie moves off the per-group choice);
    the step price ignored."""
    cascade = lambda *a, **k: "cascade"  # noqa: E731
    price = {"paged": 1.0, "cascade": 2.0}
    assert _auto(cascade, lambda p: price[p.groups[0].path]).groups[0].path == "paged"
    assert _auto(cascade, lambda p: 1.0).groups[0].path == "cascade"


def test_auto_compares_with_the_best_prefix_pass():
    """The chooser drops the prefix pass (paged) but, asked for a pass, says dense; dense is priced cheaper.
    catches: the with-a-pass alternative asked with allow_paged (it would equal the per-group choice)."""
    chooser = lambda L, b, st, private, allow_paged: "paged" if allow_paged else "dense"  # noqa: E731
    price = {"paged": 2.0, "dense": 1.0}
    assert _auto(chooser, lambda p: price[p.groups[0].path]).groups[0].path == "dense"


def test_planned_request_builds_an_equal_frozen_request():
    """The batch builder's fast constructor gives the dataclass's own object: equal, same fields, still
    frozen. Planted bug this catches: setting the fields in another order (context_len and num_new
    swapped, say) makes the objects differ."""
    import dataclasses

    from granisim.core.contract import PLANNED_SETTERS, PlannedRequest, planned_request

    assert len(PLANNED_SETTERS) == len(dataclasses.fields(PlannedRequest))
    for args in [(3, 100, 1, False), (4, 0, 512, True, -1, 0), (5, 2048, 1, False, 2, 1024)]:
        got, want = planned_request(*args), PlannedRequest(*args)
        assert got == want and dataclasses.astuple(got) == dataclasses.astuple(want)
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.num_new = 2


def test_fast_constructors_build_equal_frozen_objects():
    """``batch_plan``, ``step_result`` and the radix index's ``match_result`` give the dataclasses' own
    objects: equal, the same fields in order, still frozen. Planted bug this catches: two of
    batch_plan's setters swapped (copies and groups)."""
    import dataclasses

    from granisim.core.contract import (BatchPlan, PlannedRequest, PrefixGroup, StepResult, batch_plan, step_result,
                                        with_steps)
    from granisim.kv.hot_pool import KVCopy
    from granisim.kv.radix import MatchResult, RadixIndex, match_result

    reqs = (PlannedRequest(1, 10, 1, False), PlannedRequest(2, 0, 64, True))
    group = PrefixGroup(7, 8, "cold", "paged", (0,), 4)
    for args in [(3, "granikv", 1, reqs), (4, "paged", 16, reqs, (group,), (KVCopy(0, 64, 16),), 5, ("t",))]:
        got, want = batch_plan(*args), BatchPlan(*args)
        assert got == want and dataclasses.astuple(got) == dataclasses.astuple(want)
        assert with_steps(got, 9) == dataclasses.replace(want, num_steps=9)
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.num_steps = 2
    for args in [(0.5, {"linear": 0.25}), (1.5, {"a": 1.0}, {3: 4}, (0.5, 1.0))]:
        got, want = step_result(*args), StepResult(*args)
        assert got == want and dataclasses.astuple(got) == dataclasses.astuple(want)
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.duration_s = 2.0
    root = RadixIndex().root
    got, want = match_result(root, 5), MatchResult(root, 5)
    assert got == want and (got.node, got.length) == (root, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.length = 1
