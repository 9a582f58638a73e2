"""`granisim fuzz` output: every failure of an ExceptionGroup, and a replayable reproduction."""

from granisim.experiments.fuzz_cli import leaf_failures, sequence_of, write_repro


def _failure(msg, steps):
    err = AssertionError(msg)
    err.add_note("Failing test case: <state machine>\n" + "\n".join(steps))
    return err


def test_every_failure_of_a_group_is_listed_and_written(tmp_path):
    a = _failure("first", ["state = AllocatorMachine()", "state.evict(x=3)", "state.teardown()"])
    b = _failure("second", ["state = AllocatorMachine()", "state.maintain(rebalance=True)", "state.teardown()"])
    group = ExceptionGroup("two bugs", [a, ExceptionGroup("nested", [b])])
    failures = leaf_failures(group)
    assert failures == [a, b]
    assert sequence_of(b) == ["state = AllocatorMachine()", "state.maintain(rebalance=True)", "state.teardown()"]
    path = tmp_path / "repro.py"
    write_repro(path, failures, policy="token", examples=10, seed=1)
    text = path.read_text()
    compile(text, str(path), "exec")
    assert "def test_failure_1():" in text and "def test_failure_2():" in text
    assert "    state.evict(x=3)\n" in text and "    state.maintain(rebalance=True)\n" in text


def test_replaying_a_written_sequence_runs_the_machine(tmp_path):
    err = _failure("x", ["state = AllocatorMachine()", "state.admit(x=0)", "state.admit_role(x=12345678901234567)",
                         "state.evict(x=3)", "state.allocator_is_consistent()",
                         "state.teardown()"])
    path = tmp_path / "repro.py"
    write_repro(path, [err], policy="token", examples=1, seed=0)
    scope = {}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    scope["test_failure_1"]()  # a real policy: the replayed sequence passes
