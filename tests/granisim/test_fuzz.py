"""The fuzzer passes on the real policies and catches every planted bug.

Planted-bug runs stop at the first failing example (no shrinking, ``report_multiple_bugs``
off), so a caught bug costs seconds; the real policies run a few hundred examples here
(``granisim fuzz --examples 2000`` runs the full count on demand), with and without the
host tier, in a copy of the package with the pending fixes of ``mutants.FIXES`` applied
(bugs the fuzzer found in ``granisim/kv`` whose fix is not in the source yet).
"""

import hypothesis
import pytest
from hypothesis import Phase
from hypothesis.stateful import run_state_machine_as_test

from granisim.experiments.fuzz import HOST_POLICIES, POLICIES, allocator_machine, default_model, fuzz_settings
from granisim.experiments.fuzz_model import ModelMismatch
from granisim.experiments.mutants import FIXES, run_one
from tests.granisim.planted_bugs import PLANTED, PLANTED_POLICY

CI_EXAMPLES = 150


def first_failure(examples: int) -> hypothesis.settings:
    return hypothesis.settings(fuzz_settings(examples, report_multiple=False), phases=[Phase.generate])


@pytest.mark.parametrize("policy", POLICIES + HOST_POLICIES)
def test_real_policies_survive_fuzzing(policy):
    res = run_one(None, policy, CI_EXAMPLES, seed=1234, fixes=FIXES)
    assert not res["caught"] and res["examples"] == CI_EXAMPLES, res


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_fuzzer_catches_planted_bug(bug):
    policy = PLANTED_POLICY[bug]
    machine = allocator_machine(PLANTED[bug], default_model(policy))
    hypothesis.seed(99)(machine)
    with pytest.raises(Exception) as info:
        run_state_machine_as_test(machine, settings=first_failure(500))
    # a real violation, not a crash of the harness itself
    assert not isinstance(info.value, (TypeError, NameError, AttributeError)), repr(info.value)


def test_model_disagreement_is_reported_as_such():
    """A planted wrong counter breaks no invariant of the allocator's own: only the
    reference model can tell (the counters it reports differ from what happened)."""
    machine = allocator_machine(PLANTED["wrong_hit_counter"], default_model("token"))
    hypothesis.seed(5)(machine)
    with pytest.raises(ModelMismatch, match="counters"):
        run_state_machine_as_test(machine, settings=first_failure(500))
