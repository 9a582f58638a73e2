"""The validation workloads (long prompts, multi-turn, held out), the lengths trace and the idle hook."""

import numpy as np
import pytest

from granisim.config.scenario import ScenarioError, parse_scenario
from granisim.core.serving_loop import ServingLoop
from granisim.core.workload import Workload, load_lengths
from granisim.costmodel.executor import CostExecutor
from granisim.experiments.run import prepare
from granisim.validation.gpu_runs import HELD_OUT, MODELS, VALIDATION, split_unit, unit_name, validation_scenario


def _initial(sc):
    setup = prepare(sc)
    return Workload(sc.workload, sc.seed, setup.trace, setup.model.vocab).initial(), setup


def test_lengths_trace_draws_lengths_from_it_and_keeps_the_arrivals():
    """With lengths_trace every request's (prompt, output) length is a row of the arXiv lengths, the arrival
    times are the Azure trace's as without it, and the rows are not just the first n (drawn at random).
    Planted bug: the lengths read from the arrival trace again (``lt = tr``) fails the row check."""
    base = {"workload": {"kind": "azure", "num_requests": 60}}
    plain, _ = _initial(parse_scenario(base))
    long, _ = _initial(parse_scenario({"workload": {**base["workload"], "lengths_trace": "arxiv"}}))
    assert [s.arrival_s for s in long] == [s.arrival_s for s in plain]
    arxiv = load_lengths("arxiv")
    rows = set(zip(arxiv.num_prefill_tokens, arxiv.num_decode_tokens))
    got = [(s.prompt_len, s.output_len) for s in long]
    assert all(g in rows for g in got)
    assert got != list(zip(arxiv.num_prefill_tokens[:60], arxiv.num_decode_tokens[:60]))
    assert np.mean([p for p, _ in got]) > 1500 > np.mean([s.prompt_len for s in plain])


def test_lengths_trace_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("num_prefill_tokens,num_decode_tokens\n10,2\n7,0\n")
    with pytest.raises(ScenarioError, match=r"field workload.lengths_trace = .*row 2, column num_decode_tokens = 0"):
        parse_scenario({"workload": {"lengths_trace": str(bad)}})
    with pytest.raises(ScenarioError, match=r"field workload.lengths_trace = 'nope.csv': file not found"):
        parse_scenario({"workload": {"lengths_trace": "nope.csv"}})
    cols = tmp_path / "cols.csv"
    cols.write_text("a,b\n1,2\n")
    with pytest.raises(ScenarioError, match=r"lengths_trace.*missing column"):
        parse_scenario({"workload": {"lengths_trace": str(cols)}})


def test_validation_set_has_long_prompts_multi_turn_and_one_held_out():
    assert len(HELD_OUT) == 1 and HELD_OUT[0] in VALIDATION
    for name in VALIDATION:
        sc = validation_scenario(name, None, "h200")
        assert sc.workload.num_requests == VALIDATION[name]["workload"]["num_requests"]
    assert validation_scenario("azure_replay", 96, "h200").workload.num_requests == 96
    long = [n for n, w in VALIDATION.items() if w["workload"].get("lengths_trace")]
    multi = [n for n, w in VALIDATION.items() if w["workload"].get("turns", 1) > 1]
    assert {VALIDATION[n]["workload"]["num_requests"] for n in long} == {150, 500}
    assert {VALIDATION[n]["workload"]["num_requests"] * VALIDATION[n]["workload"]["turns"] for n in multi} == {150, 501}
    sc = validation_scenario("multi_turn_150", None, "h200", "paged16", "qwen-2.5-14b")
    assert (sc.policy.name, sc.model.name, sc.workload.think_time_s) == ("paged16", "qwen-2.5-14b", 2.0)
    assert validation_scenario("control_short", None, "h200", "granikv-auto").policy.dispatch == "auto"


def test_unit_names_round_trip():
    for w in VALIDATION:
        for p in ("granikv", "token", "paged16", "granikv-auto"):
            for m in MODELS:
                assert split_unit(unit_name(w, p, m)) == (w, p, m)
                assert split_unit(unit_name(w, p, m) + "_noidle") == (w, p, m)
    assert split_unit("multi_agent_16k") == ("multi_agent_16k", "granikv", "llama-3.1-8b")  # an older run
    assert split_unit("multi_agent_16k_gc") == ("multi_agent_16k", "granikv", "llama-3.1-8b")
    assert split_unit("elsewhere") is None


class _Idler(CostExecutor):
    def __init__(self, *a):
        super().__init__(*a)
        self.gaps = []

    def idle(self, seconds):
        self.gaps.append(seconds)


def test_idle_hook_gets_every_gap_and_changes_nothing():
    """The serving loop hands an executor with idle() exactly the time the engine stood still: the sum of the
    gaps equals the idle time in the step log (each step's start minus the previous step's end), and the
    run is the same as without the hook. Multi-turn, so think times count too. Planted bugs: the gap taken
    from the last pending arrival (``self._pending[-1]``) fails the sum."""
    sc = parse_scenario({"model": {"name": "llama-3.1-8b"}, "hardware": {"profile": "h200"},
                         "workload": {"kind": "azure", "num_requests": 40, "turns": 2, "think_time_s": 1.0,
                                      "max_output_len": 16}})
    setup = prepare(sc)
    ex = _Idler(setup.profile, setup.model)
    res = ServingLoop(setup, ex, progress=False).run()
    ref = ServingLoop(setup, CostExecutor(setup.profile, setup.model), progress=False).run()
    steps = res.steps.frame()
    ends = (steps.start_s + steps.duration_s).to_numpy()
    stood = np.clip(steps.start_s.to_numpy()[1:] - ends[:-1], 0, None)
    assert len(ex.gaps) > 5 and min(ex.gaps) > 0
    assert sum(ex.gaps) == pytest.approx(float(stood.sum()) + float(steps.start_s.iloc[0]), rel=1e-9)
    assert res.end_s == ref.end_s
    assert [(r.rid, r.finish_s) for r in res.records] == [(r.rid, r.finish_s) for r in ref.records]
