"""Mutation testing in CI, on a small sample: each planted source bug must be caught.

``python -m granisim.experiments.mutants`` runs the whole list on demand (2,000 examples
per mutant and policy); here a few mutants, one per kind of check (a free-list off-by-one
seen by the tiling check, a broken promise, a wrong counter seen only by the reference
model, a host-tier slab read while its KV is only on host), each stopping at the first
failing example, with the pending fixes (``FIXES``) applied as the whole-list run does.
"""

import pytest

from granisim.experiments.mutants import FIXES, MUTANTS, run_one

SAMPLE = ["hot_release_leaks_last_slot", "token_need_one_short", "evicted_tokens_counts_nodes",
          "slab_read_while_on_host"]


def test_every_mutant_applies_to_the_current_source(tmp_path):
    from granisim.experiments.mutants import patched_copy

    assert len(MUTANTS) >= 25 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        patched_copy(m, tmp_path / m.name)  # raises when its line no longer occurs exactly once
        patched_copy(m, tmp_path / f"{m.name}_fixed", FIXES)  # and once the pending fixes are in


@pytest.mark.parametrize("name", SAMPLE)
def test_sampled_mutant_is_caught(name):
    mutant = next(m for m in MUTANTS if m.name == name)
    res = run_one(mutant, mutant.policies[0], examples=300, seed=1, fixes=FIXES)
    assert res["caught"], res
    assert not res["error"].startswith(("TypeError", "NameError", "AttributeError")), res


def test_a_mutant_whose_code_does_not_run_is_not_caught():
    """A mutant that refers to a name the source no longer has fails with a NameError at its first
    example; that is a broken mutant, not a bug the fuzzer caught. Planted bug caught: counting any
    exception as a catch (the whole list then reported such a mutant as caught)."""
    from granisim.experiments.mutants import Mutant

    broken = Mutant("uses_a_gone_name", "broken", "kv/allocator.py", old="""
        seq.drop_front(k)
""", new="""
        seq.drop_front(k)
        self.store.release(no_such_name[-1:])
""", policies=["token"])
    res = run_one(broken, "token", examples=300, seed=1)
    assert not res["caught"] and res["error"].startswith("broken mutant: NameError"), res

