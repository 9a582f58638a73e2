"""``granisim fuzz``: run the allocator fuzzer, print every shrunk failure, write a reproduction.

Hypothesis shrinks each distinct failure it finds to a short rule sequence; when it finds
several it raises them together as an ``ExceptionGroup``. Every one is printed (the error
and its sequence) and all are written to one replayable test file (``--repro``, default
``out/fuzz/repro_<policy>.py``): run it with ``pytest`` or ``python``.

``--host-tier`` fuzzes the policy with the host KV tier on (fuzz policy ``<policy>-host``):

    python -m granisim.experiments.fuzz_cli --allocator granikv --host-tier --examples 2000
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from granisim.config.files import out_file

REPRO_HEADER = '''"""Reproduction written by `granisim fuzz --allocator {policy} --examples {examples} --seed {seed}`.

Each test replays one shrunk failing rule sequence. Run: pytest {path}  (or: python {path})
"""

from granisim.experiments.fuzz import allocator_machine, default_factory, default_model

AllocatorMachine = allocator_machine(default_factory({policy!r}), default_model({policy!r}))
'''


def leaf_failures(err: BaseException) -> list[BaseException]:
    """The individual failures of a (possibly nested) exception group, or ``[err]``."""
    if isinstance(err, BaseExceptionGroup):
        return [leaf for sub in err.exceptions for leaf in leaf_failures(sub)]
    return [err]


def sequence_of(err: BaseException) -> list[str]:
    """The shrunk rule sequence hypothesis attached to a failure as notes (``state.rule(...)`` lines)."""
    lines = [line.strip() for note in getattr(err, "__notes__", []) for line in note.splitlines()]
    return [line for line in lines if line.startswith("state = ") or line.startswith("state.")]


def write_repro(path: Path, failures: list[BaseException], *, policy: str, examples: int, seed: int) -> None:
    out = [REPRO_HEADER.format(policy=policy, examples=examples, seed=seed, path=path)]
    for i, err in enumerate(failures, 1):
        steps = sequence_of(err) or ["state = AllocatorMachine()"]
        first = str(err).splitlines()[0] if str(err) else ""
        out.append(f"\ndef test_failure_{i}():\n    # {type(err).__name__}: {first}"[:200] + "\n")
        out.extend(f"    {s}\n" for s in steps)
    out.append("\n\nif __name__ == '__main__':\n")
    out.extend(f"    test_failure_{i}()\n" for i in range(1, len(failures) + 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(out))


def progress_machine(machine, examples: int):
    """``machine`` subclassed so that each new example advances a tqdm bar on stderr, and a stop that
    landed where it was swallowed (a garbage-collector callback of hypothesis's) is raised again."""
    from tqdm import tqdm

    from granisim.experiments.stopping import requested

    bar = tqdm(total=examples, desc="fuzz", unit="ex", file=sys.stderr, disable=not sys.stderr.isatty(),
               leave=False)

    class WithProgress(machine):
        def __init__(self):
            stop = requested()
            if stop is not None:
                raise stop
            super().__init__()
            if not bar.disable and bar.n < bar.total:
                bar.update(1)

    WithProgress.__name__ = machine.__name__
    return WithProgress, bar


@contextmanager
def _scratch_hypothesis_home():
    """Hypothesis caches what it reads of the code under ``.hypothesis/`` in the current folder (the
    fuzzer keeps no example database): a run leaves nothing there, unless HYPOTHESIS_STORAGE_DIRECTORY
    names a folder for it."""
    from hypothesis.configuration import set_hypothesis_home_dir

    if os.getenv("HYPOTHESIS_STORAGE_DIRECTORY"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="granisim-fuzz-") as home:
        set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            set_hypothesis_home_dir(None)


def run_fuzz(args) -> int:
    import hypothesis
    from hypothesis.stateful import run_state_machine_as_test

    from granisim.experiments import fuzz
    from granisim.experiments.stopping import requested

    policy = fuzz.host_policy(args.allocator) if getattr(args, "host_tier", False) else args.allocator
    args.allocator = policy
    try:  # found before the fuzzing, not when a failure's reproduction would be written (and lost)
        repro = out_file(args.repro or f"out/fuzz/repro_{policy}.py", "--repro", "the reproduction file to write")
    except ValueError as err:
        print(f"granisim fuzz: error: {err}", file=sys.stderr)
        return 2
    model = fuzz.default_model(policy) if not args.no_model else None
    machine, bar = progress_machine(fuzz.allocator_machine(fuzz.default_factory(policy), model), args.examples)
    hypothesis.seed(args.seed)(machine)
    try:
        with fuzz.rare_full_collections(), _scratch_hypothesis_home():
            run_state_machine_as_test(machine, settings=fuzz.fuzz_settings(args.examples, args.max_steps))
    except Exception as err:
        bar.close()
        if requested() is not None:  # hypothesis caught the stop where it landed: a stop, not a failure
            raise requested() from None
        failures = leaf_failures(err)
        for i, f in enumerate(failures, 1):
            print(f"\n--- failure {i} of {len(failures)} ({args.allocator}): {type(f).__name__}: {f}", file=sys.stderr)
            print("\n".join(sequence_of(f)) or "(no rule sequence attached)", file=sys.stderr)
        write_repro(repro, failures, policy=args.allocator, examples=args.examples, seed=args.seed)
        print(f"\nFUZZ FAILURE ({args.allocator}): {len(failures)} distinct failure(s); reproduction: {repro}",
              file=sys.stderr)
        return 1
    bar.close()
    if requested() is not None:
        raise requested()
    print(f"fuzz {args.allocator}: {args.examples} examples, no invariant violated (seed {args.seed})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``granisim fuzz`` (also runnable as ``python -m granisim.experiments.fuzz_cli``, with the same options)."""
    from granisim.cli import main as cli_main

    return cli_main(["fuzz", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
