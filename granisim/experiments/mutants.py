"""Mutation testing of the allocator fuzzer: plant bugs one at a time and see which it catches.

Each mutant (``mutants.toml``) is a one-place source edit of ``granisim/kv/`` (an off-by-one in a free list,
a lock or refcount slip, an eviction or compaction mistake, a leaked reservation, a wrong
counter, paged flooring, an adaptive boundary error, ...). For every mutant and every
policy it names, a copy of the package is patched in a temporary directory and the
fuzzer (invariants and the reference model) runs on it in a fresh Python process until
the first failure or ``--examples`` examples. A mutant is *caught* when that run fails.

    python -m granisim.experiments.mutants                     # the whole list, 2000 examples
    python -m granisim.experiments.mutants --only NAME,NAME --examples 300

Writes ``mutants.json`` and ``mutants.md`` (one row per mutant: caught, examples needed,
CPU seconds, the first failure) under ``--out`` (default ``out/mutants``) and prints the
table. Exit status 1 when a mutant survives.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # granisim/


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str
    file: str  # relative to granisim/
    old: str  # must occur exactly once
    new: str
    policies: list[str]


def load_mutants(path: Path = Path(__file__).with_name("mutants.toml")) -> list[Mutant]:
    """The planted bugs, as data (``mutants.toml``: one ``[[mutant]]`` table each)."""
    return [Mutant(**m) for m in tomllib.loads(path.read_text())["mutant"]]


MUTANTS = load_mutants()


# Fixes of allocator bugs the fuzzer finds in the current source, not yet applied there (each a one-place
# edit, like a mutant). ``--fixes`` applies them to every copy (mutated or not) so that a mutant is caught
# for its own bug, not for one the source already has; the "(none)" rows fuzz the source without a mutant.
FIXES: list[Mutant] = []  # none pending


# Runs in the child process: import the patched package (cwd and PYTHONPATH point at the copy), fuzz one policy.
_CHILD = r"""
import json, sys, time
root, policy, examples, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import granisim
assert granisim.__file__.startswith(root), f"imported {granisim.__file__}, not the mutant under {root}"
import hypothesis
from hypothesis import Phase
from hypothesis.stateful import run_state_machine_as_test
from granisim.experiments.fuzz import allocator_machine, default_factory, default_model, fuzz_settings, rare_full_collections
base = allocator_machine(default_factory(policy), default_model(policy))
count = [0]
class Counting(base):
    def __init__(self):
        count[0] += 1
        super().__init__()
hypothesis.seed(seed)(Counting)
settings = hypothesis.settings(fuzz_settings(examples, report_multiple=False), phases=[Phase.generate])
t0 = time.process_time()
out = dict(caught=False, examples=examples, error="")
try:
    with rare_full_collections():
        run_state_machine_as_test(Counting, settings=settings)
except BaseException as err:
    msg = str(err).splitlines()[0] if str(err) else ""
    # a mutant whose code does not run (a name it uses is gone) plants no bug: it is broken, not caught
    broken = isinstance(err, (NameError, SyntaxError, ImportError))
    out = dict(caught=not broken, examples=count[0],
               error=("broken mutant: " if broken else "") + f"{type(err).__name__}: {msg}"[:160])
out["cpu_s"] = round(time.process_time() - t0, 2)
print("RESULT " + json.dumps(out))
"""


def _apply(edit: Mutant, dst: Path) -> None:
    path = dst / edit.file
    text = path.read_text()
    if text.count(edit.old) != 1:
        raise ValueError(f"mutant {edit.name}: its source line occurs {text.count(edit.old)} times in "
                         f"granisim/{edit.file} (expected once; the code has changed)")
    path.write_text(text.replace(edit.old, edit.new))


def patched_copy(mutant: Mutant | None, tmp: Path, fixes: list[Mutant] = ()) -> Path:
    """A copy of the package under ``tmp`` with ``fixes`` and then the mutant (None: no mutant)
    applied; returns the directory to import from."""
    dst = tmp / "granisim"
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__", "data", "profiles"))
    for keep in ("config/data", "config/profiles"):
        if (PACKAGE / keep).exists():
            (dst / keep).symlink_to(PACKAGE / keep)
    for edit in [*fixes, *([mutant] if mutant is not None else [])]:
        _apply(edit, dst)
    return tmp


def run_one(mutant: Mutant | None, policy: str, examples: int, seed: int = 1, timeout_s: float = 900,
            fixes: list[Mutant] = ()) -> dict:
    """Fuzz one mutant (None: the source as it is) under one policy in a fresh process:
    caught, examples, cpu_s, error."""
    with tempfile.TemporaryDirectory(prefix=f"mutant_{mutant.name if mutant else 'none'}_") as tmp:
        root = patched_copy(mutant, Path(tmp), fixes)
        env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, str(root), policy, str(examples), str(seed)],
                                  cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return dict(caught=False, examples=examples, cpu_s=None, error=f"timed out after {timeout_s} s")
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return dict(caught=False, examples=0, cpu_s=None, error=f"harness failed: {tail}"[:200])
    return json.loads(lines[-1][len("RESULT "):])


def run_all(mutants: list[Mutant], examples: int, seed: int, jobs: int = 1, *, fixes: list[Mutant] = (),
            baseline: list[str] = ()) -> list[dict]:
    """One row per (mutant, policy), after one "(none)" row per policy of ``baseline`` (no mutant:
    a failure there is a bug of the source itself, and the catches of that policy mean little)."""
    tasks = [(None, p) for p in baseline] + [(m, p) for m in mutants for p in m.policies]

    def one(task):
        m, p = task
        res = run_one(m, p, examples, seed, fixes=fixes)
        name, kind, file = (m.name, m.kind, f"granisim/{m.file}") if m else ("(none)", "no mutant", "")
        row = dict(mutant=name, kind=kind, file=file, policy=p, **res)
        mark = ("caught" if res["caught"] else "SURVIVED") if m else ("FAILS" if res["caught"] else "clean")
        print(f"{name:<36} {p:<22} {mark:<8} {res['examples']:>5} ex {res['cpu_s']} s  {res['error'][:60]}",
              file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one, tasks))


def table(rows: list[dict]) -> str:
    out = ["| mutant | kind | policy | caught | examples | CPU s | first failure |", "|---|---|---|---|---:|---:|---|"]
    for r in rows:
        err = r["error"].replace("|", "/")
        if r["mutant"] == "(none)":
            mark = "**fails**" if r["caught"] else "clean"
        else:
            mark = "yes" if r["caught"] else "**no**"
        out.append(f"| {r['mutant']} | {r['kind']} | {r['policy']} | {mark} | {r['examples']} | {r['cpu_s']} | {err} |")
    muts = [r for r in rows if r["mutant"] != "(none)"]
    base = [r for r in rows if r["mutant"] == "(none)"]
    out.append(f"\n{sum(r['caught'] for r in muts)} of {len(muts)} caught.")
    if base:
        out.append(f"Source without a mutant: {sum(not r['caught'] for r in base)} of {len(base)} policies clean.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m granisim.experiments.mutants", description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--jobs", type=int, default=1, help="mutants fuzzed at once")
    ap.add_argument("--out", default="out/mutants")
    ap.add_argument("--fixes", action="store_true", help="apply the pending fixes (FIXES) to every copy first")
    ap.add_argument("--baseline", action="store_true", help="also fuzz the source without a mutant, per policy")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args(argv)
    if args.examples < 1 or args.jobs < 1:
        print(f"mutants: --examples and --jobs must be >= 1, got {args.examples} and {args.jobs}", file=sys.stderr)
        return 2
    chosen = MUTANTS
    if args.only:
        names = {m.name for m in MUTANTS}
        wanted = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = [x for x in wanted if x not in names]
        if unknown:
            print(f"mutants: --only: unknown mutant {unknown[0]!r} (see --list)", file=sys.stderr)
            return 2
        chosen = [m for m in MUTANTS if m.name in wanted]
    if args.list:
        for m in chosen:
            print(f"{m.name:<36} {m.kind:<26} granisim/{m.file}  {','.join(m.policies)}")
        return 0
    fixes = FIXES if args.fixes else []
    baseline = sorted({p for m in chosen for p in m.policies}) if args.baseline else []
    rows = run_all(chosen, args.examples, args.seed, args.jobs, fixes=fixes, baseline=baseline)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(examples=args.examples, seed=args.seed, fixes=[asdict(f) for f in fixes],
                mutants=[asdict(m) for m in chosen])
    (out / "mutants.json").write_text(json.dumps(dict(meta, results=rows), indent=1))
    text = table(rows)
    with_fixes = f", with the pending fixes {', '.join(f.name for f in fixes)}" if fixes else ""
    (out / "mutants.md").write_text(f"Mutants fuzzed at {args.examples} examples, seed {args.seed}{with_fixes}.\n\n"
                                    f"{text}\n")
    print(text)
    muts_ok = all(r["caught"] for r in rows if r["mutant"] != "(none)")
    base_ok = not any(r["caught"] for r in rows if r["mutant"] == "(none)")
    return 0 if muts_ok and base_ok else 1


if __name__ == "__main__":
    sys.exit(main())
