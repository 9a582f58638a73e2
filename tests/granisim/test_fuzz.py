"""The fuzzer passes on the real policies and catches every planted bug."""

import hypothesis
import pytest
from hypothesis.stateful import run_state_machine_as_test

from granisim.experiments.fuzz import allocator_machine, default_factory, fuzz_settings
from tests.granisim.planted_bugs import PLANTED

CI_EXAMPLES = 2000


@pytest.mark.parametrize("policy", ["granikv", "granikv-adaptive", "token", "paged"])
def test_real_policies_survive_fuzzing(policy):
    machine = allocator_machine(default_factory(policy))
    hypothesis.seed(1234)(machine)
    run_state_machine_as_test(machine, settings=fuzz_settings(CI_EXAMPLES))


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_fuzzer_catches_planted_bug(bug):
    machine = allocator_machine(PLANTED[bug])
    hypothesis.seed(99)(machine)
    with pytest.raises(Exception) as info:
        run_state_machine_as_test(machine, settings=fuzz_settings(500))
    # a real violation, not a crash of the harness itself
    assert not isinstance(info.value, (TypeError, NameError, AttributeError)), repr(info.value)
