"""granisim validation refit --only: a profile with just some coefficient families refitted."""
import pytest

from granisim.validation.refit import only_values

FIT = {"engine.eager.linear.scale": 0.92, "engine.eager.linear.offset_s": 4e-4, "engine.eager.linear_floor_s": 0.0,
       "engine.eager.lm_head.scale": 1.0, "engine.linear.scale": 1.0, "overhead.step_s": 3e-4}


def test_only_takes_the_named_families_and_nothing_else():
    assert only_values(FIT, ["engine.eager.linear"]) == {
        "engine.eager.linear.scale": 0.92, "engine.eager.linear.offset_s": 4e-4, "engine.eager.linear_floor_s": 0.0}
    assert only_values(FIT, ["overhead.", "engine.linear."]) == {"overhead.step_s": 3e-4, "engine.linear.scale": 1.0}


def test_a_prefix_that_names_nothing_is_refused():
    with pytest.raises(ValueError, match="--only engine.eager.linaer: the fit has no coefficient"):
        only_values(FIT, ["engine.eager.linear", "engine.eager.linaer"])
