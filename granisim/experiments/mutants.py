"""Mutation testing of the allocator fuzzer: plant bugs one at a time and see which it catches.

Each mutant is a one-place source edit of ``granisim/kv/`` (an off-by-one in a free list,
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


MUTANTS = [Mutant(**m) for m in [
    # ---- HOT pool: free ranges, slabs, compaction
    dict(name="hot_merge_left_off_by_one", kind="free list off-by-one", file="kv/hot_pool.py",
         old="if i > 0 and self._free_starts[i - 1] + self._free_lens[i - 1] == start:",
         new="if i > 0 and self._free_starts[i - 1] + self._free_lens[i - 1] >= start - 1:", policies=["granikv"]),
    dict(name="hot_best_fit_one_short", kind="free list off-by-one", file="kv/hot_pool.py",
         old="if length >= n and (best < 0 or length < self._free_lens[best]):",
         new="if length >= n - 1 and (best < 0 or length < self._free_lens[best]):", policies=["granikv"]),
    dict(name="hot_release_leaks_last_slot", kind="leaked reservation", file="kv/hot_pool.py",
         old="        del self._slabs[slab]\n        self._insert_free(start, length)",
         new="        del self._slabs[slab]\n        if length > 1:\n            self._insert_free(start, length - 1)",
         policies=["granikv"]),
    dict(name="hot_compact_drops_last_slot", kind="compaction mistake", file="kv/hot_pool.py",
         old="        end = self.slot_start + self.capacity\n        self._free_starts = [cursor]",
         new="        end = self.slot_start + self.capacity - 1\n        self._free_starts = [cursor]",
         policies=["granikv"]),
    dict(name="hot_split_tail_overlaps_head", kind="slab boundary off-by-one", file="kv/hot_pool.py",
         old="self._slabs[tail] = (start + head_length, length - head_length)",
         new="self._slabs[tail] = (start + head_length - 1, length - head_length + 1)", policies=["granikv"]),
    dict(name="compaction_copies_reversed", kind="compaction mistake", file="kv/hot_pool.py",
         old="copies.append(KVCopy(src=start, dst=cursor, length=length))",
         new="copies.append(KVCopy(src=cursor, dst=start, length=length))", policies=["granikv"]),
    dict(name="compaction_leaves_nodes_stale", kind="compaction mistake", file="kv/hot_slabs.py",
         old="                node.value = np.arange(start, start + length, dtype=np.int64)",
         new="                pass", policies=["granikv"]),
    # ---- COLD / paged pools and stores
    dict(name="cold_allocate_keeps_one_on_stack", kind="free list off-by-one", file="kv/cold_pool.py",
         old="        self._top -= n\n        self._is_free[out - self.slot_start] = False",
         new="        self._top -= max(0, n - 1)\n        self._is_free[out - self.slot_start] = False",
         policies=["token"]),
    dict(name="token_need_one_short", kind="wrong count", file="kv/stores.py",
         old="        return max(0, n - spare)", new="        return max(0, n - spare - 1)", policies=["token"]),
    dict(name="paged_need_floors_pages", kind="paged flooring", file="kv/stores.py",
         old="return -(-extra // self.page_size) * self.page_size",
         new="return (extra // self.page_size) * self.page_size", policies=["paged"]),
    dict(name="paged_match_not_floored", kind="paged flooring", file="kv/radix.py",
         old="        return m - m % self.page_size", new="        return m", policies=["paged"]),
    dict(name="extend_ignores_spare_page_slots", kind="tightness", file="kv/allocator.py",
         old="        need = self.store.need(seq.priv.size - seq.n_priv, from_priv)\n        if need > self.store.free:\n            self.eviction",
         new="        need = self.store.need(0, from_priv)\n        if need > self.store.free:\n            self.eviction",
         policies=["paged"]),
    # ---- radix index: locks, refcounts, LRU
    dict(name="second_lock_not_counted", kind="refcount slip", file="kv/radix.py",
         old="            else:\n                node.lock_ref += 1\n            node = node.parent",
         new="            else:\n                pass\n            node = node.parent", policies=["token"]),
    dict(name="split_head_unlocked", kind="refcount slip", file="kv/radix.py",
         old="        head.lock_ref = child.lock_ref", new="        head.lock_ref = 0", policies=["token"]),
    dict(name="unlock_does_not_touch", kind="LRU order", file="kv/radix.py",
         old="            node.last_access = now\n            if node.lock_ref == 1:",
         new="            if node.lock_ref == 1:", policies=["token"]),
    dict(name="lookup_does_not_touch", kind="LRU order", file="kv/radix.py",
         old="            child.last_access = now\n            node, pos = child, pos + m",
         new="            node, pos = child, pos + m", policies=["token"]),
    dict(name="evicted_parent_never_a_leaf", kind="eviction mistake", file="kv/radix.py",
         old="        if parent is not self.root and not parent.children:\n            self._leaves.add(parent)",
         new="        if False:\n            self._leaves.add(parent)", policies=["token"]),
    dict(name="removed_leaf_still_counted", kind="wrong count", file="kv/radix.py",
         old="        self._account(leaf, -1)\n        parent = leaf.parent",
         new="        parent = leaf.parent", policies=["paged"]),
    dict(name="hot_eviction_most_recent_first", kind="LRU order", file="kv/eviction.py",
         old="self.radix.evict_subtree(min(victims, key=lambda x: (x.last_access, x.id)), self.free_node)",
         new="self.radix.evict_subtree(max(victims, key=lambda x: (x.last_access, x.id)), self.free_node)",
         policies=["granikv"]),
    dict(name="clear_cache_skips_below_locked", kind="eviction mistake", file="kv/eviction.py",
         old="        return sum(self._evict_unlocked(c) for c in list(node.children.values()))",
         new="        return 0", policies=["token"]),
    # ---- counters
    dict(name="evicted_tokens_counts_nodes", kind="wrong counter", file="kv/eviction.py",
         old="        self.counters.evicted_tokens += len(node)", new="        self.counters.evicted_tokens += 1",
         policies=["token"]),
    dict(name="hit_tokens_off_by_one", kind="wrong counter", file="kv/allocator.py",
         old="        self.counters.hit_tokens += m.length", new="        self.counters.hit_tokens += max(0, m.length - 1)",
         policies=["token"]),
    dict(name="hot_placement_not_counted", kind="wrong counter", file="kv/hot_slabs.py",
         old="            self.counters.hot_placements += 1\n", new="", policies=["granikv"]),
    # ---- admission and growth promises
    dict(name="admit_counts_locked_path_as_free", kind="over-admission", file="kv/allocator.py",
         old="        avail = self.store.free + self.radix.evictable.get(self.store.name, 0) - on_path\n",
         new="        avail = self.store.free + self.radix.evictable.get(self.store.name, 0)\n", policies=["token"]),
    dict(name="admit_ignores_reserve", kind="over-admission", file="kv/allocator.py",
         old="        need = tokens.size - m.length + reserve\n", new="        need = tokens.size - m.length\n",
         policies=["token"]),
    dict(name="admit_matches_whole_prompt", kind="boundary off-by-one", file="kv/allocator.py",
         old="        m = self.radix.match_prefix(tokens, tokens.size - 1)  # at least one token is computed",
         new="        m = self.radix.match_prefix(tokens, tokens.size)", policies=["token"]),
    dict(name="slab_room_off_by_one", kind="boundary off-by-one", file="kv/allocator.py",
         old="        from_priv = n - min(n, seq.slab_len - min(seq.n_new, seq.slab_len))",
         new="        from_priv = n - min(n, seq.slab_len + 1 - min(seq.n_new, seq.slab_len))", policies=["granikv"]),
    dict(name="batched_decode_evicts_one_short", kind="batched decode", file="kv/allocator.py",
         old="            self.eviction.evict(self.store.name, total - self.store.free)",
         new="            self.eviction.evict(self.store.name, total - self.store.free - 1)", policies=["token"]),
    dict(name="batched_decode_forgets_growth", kind="batched decode", file="kv/allocator.py",
         old="            q.n_new += n\n        return list(block)", new="        return list(block)",
         policies=["token"]),
    dict(name="batched_fast_path_on_pages", kind="batched decode", file="kv/allocator.py",
         old="        if self.page_size != 1:\n            return False\n", new="", policies=["paged"]),
    # ---- caching and release
    dict(name="cached_duplicate_not_freed", kind="leaked reservation", file="kv/allocator.py",
         old="        if dup:\n            self.store.release(seq.priv[:dup])", new="        if False:\n            pass",
         policies=["token"]),
    dict(name="caching_private_double_frees", kind="double free", file="kv/allocator.py",
         old="        seq.drop_front(k)\n", new="        seq.drop_front(k)\n        if k:\n            self.store.release(slots[-1:])\n",
         policies=["token"]),
    dict(name="slab_duplicate_off_by_one", kind="slab boundary off-by-one", file="kv/hot_slabs.py",
         old="        dup = already - seq.cached_len\n", new="        dup = already - seq.cached_len + 1\n",
         policies=["granikv"]),
    dict(name="exact_fit_prompt_gets_no_slab", kind="boundary off-by-one", file="kv/hot_slabs.py",
         old="matched < shared_len <= prompt_len", new="matched < shared_len < prompt_len", policies=["granikv"]),
    dict(name="exact_fit_slab_refused", kind="boundary off-by-one", file="kv/hot_slabs.py",
         old="        if n > hot.capacity:\n            return False", new="        if n >= hot.capacity:\n            return False",
         policies=["granikv"]),
    # ---- adaptive HOT/COLD boundary
    dict(name="grow_ignores_headroom", kind="adaptive boundary", file="kv/hot_slabs.py",
         old="            - int(HOT_HEADROOM * self.budget)\n", new="\n", policies=["granikv-adaptive"]),
    dict(name="shrink_below_hysteresis", kind="adaptive boundary", file="kv/hot_slabs.py",
         old="        if give >= self.hysteresis:\n            hot.shrink_top(give)",
         new="        if give >= 1:\n            hot.shrink_top(give)", policies=["granikv-adaptive"]),
    dict(name="shrink_beyond_demand", kind="adaptive boundary", file="kv/hot_slabs.py",
         old="        give = min(hot.capacity - target, hot.free)\n", new="        give = hot.free\n",
         policies=["granikv-adaptive"]),
    dict(name="give_low_loses_a_free_slot", kind="adaptive boundary", file="kv/elastic.py",
         old="        free = free[free >= self.slot_start + n]", new="        free = free[free > self.slot_start + n]",
         policies=["granikv-adaptive"]),
    dict(name="take_low_slots_not_free", kind="adaptive boundary", file="kv/elastic.py",
         old="        self._is_free = np.concatenate([np.ones(n, bool), self._is_free])",
         new="        self._is_free = np.concatenate([np.zeros(n, bool), self._is_free])",
         policies=["granikv-adaptive"]),
    dict(name="grow_top_boundary_off_by_one", kind="adaptive boundary", file="kv/elastic.py",
         old="        self.capacity += n\n        self._insert_free(end, n)",
         new="        self.capacity += n\n        self._insert_free(end - 1, n)", policies=["granikv-adaptive"]),
    # ---- host KV tier (fuzzed with the tier on: policies "<policy>-host")
    dict(name="slab_read_while_on_host", kind="host tier", file="kv/allocator.py",
         old="                ht.prefetch(np.arange(s0, s0 + seq.slab_len, dtype=np.int64), host_slots[cached:end], True)\n",
         new="", policies=["granikv-host"]),
    dict(name="prefetch_forgets_radix_node", kind="host tier", file="kv/allocator.py",
         old="                seq.n_new = seq.slab_len\n", new="                return\n", policies=["granikv-host"]),
    dict(name="pages_read_while_on_host", kind="host tier", file="kv/allocator.py",
         old="            ht.prefetch(new, host_slots[cached:length], False)\n", new="", policies=["token-host"]),
    dict(name="write_back_skips_copy", kind="host tier", file="kv/host_tier.py",
         old='                self._push("to_host", g.value[lo - pos : hi - pos], host[lo - start : hi - start], '
             'g.pool == "hot")\n',
         new="                pass\n", policies=["token-host", "granikv-adaptive-host"]),
    dict(name="host_drop_keeps_slots", kind="host tier", file="kv/host_tier.py",
         old="        self.pool.free_slots(leaf.value)\n        self.bytes_dropped",
         new="        self.bytes_dropped", policies=["paged-host"]),
]]


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
from granisim.experiments.fuzz import allocator_machine, default_factory, default_model, fuzz_settings
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
    run_state_machine_as_test(Counting, settings=settings)
except BaseException as err:
    msg = str(err).splitlines()[0] if str(err) else ""
    out = dict(caught=True, examples=count[0], error=f"{type(err).__name__}: {msg}"[:160])
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
