"""Stateful fuzzing of the allocator with the host KV tier on (granisim/kv/host_invariants.py).

Each policy runs with a host tier smaller than the traffic (host eviction happens). Checked after
every rule: host slots tile the host pool, tiers stay apart, host runs and every live request's
layout hold their own tokens (shadow arrays replayed through the plan's compaction copies and
transfers in order), host bytes in = dropped + resident, and each prefetch is restored in the GPU
radix index (its GPU slots lie on the admitted request's radix path).

Planted bugs, each shown to fail here (``test_planted_bugs_are_caught``): a prefetch that skips the
copy (the slab is then read while its KV is only on host) and a prefetch that forgets to restore the
radix node (the slab stays the request's own). ``HOST_FUZZ_EXAMPLES=2000`` runs the acceptance size.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from granisim.kv import host_tier as host_tier_mod
from granisim.kv.allocator import KVAllocator, make_allocator
from granisim.kv.host_invariants import check_host_tier, check_transfers, replay
from granisim.kv.host_tier import HostTierConfig
from granisim.kv.sequence import path_slots

EXAMPLES = int(os.environ.get("HOST_FUZZ_EXAMPLES", "60"))
CAP, HOST_CAP, PREFIX, VOCAB = 160, 130, 40, 7
_rng = np.random.default_rng(3)
PREFIXES = [_rng.integers(0, VOCAB, PREFIX).astype(np.int64) for _ in range(3)]
CONFIGS = {
    "granikv-slabs": ("granikv", "slabs", "lru", "all"),
    "granikv-slabs+pages": ("granikv", "slabs+pages", "next_use", "all"),
    "granikv-reused": ("granikv", "slabs+pages", "lru", "reused"),
    "token": ("token", "slabs+pages", "lru", "all"),
    "paged4": ("paged4", "slabs+pages", "next_use", "all"),
}


def machine(name: str):
    policy, mode, eviction, write = CONFIGS[name]

    class HostTierMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            kw = dict(hot_fraction=0.5) if policy == "granikv" else {}
            self.alloc = make_allocator(policy, CAP, host=HostTierConfig(HOST_CAP, 2, mode, eviction, write), **kw)
            self.gpu = np.full(CAP, -1, np.int64)
            self.host = np.full(HOST_CAP, -1, np.int64)
            self.reqs: dict[int, dict] = {}
            self.next = 0

        def _sync(self):
            copies, transfers = self.alloc.take_copies(), self.alloc.take_transfers()
            check_transfers(self.alloc, transfers)
            replay(copies, transfers, self.gpu, self.host)
            return transfers

        def _write(self, rid, n):
            r = self.reqs[rid]
            slots = self.alloc.extend(rid, n)
            self._sync()
            self.gpu[slots] = r["tokens"][r["done"] : r["done"] + n]
            r["done"] += n

        @rule(which=st.integers(0, 2), suffix=st.integers(1, 24), seed=st.integers(0, 9))
        def admit(self, which, suffix, seed):
            rng = np.random.default_rng(seed * 31 + suffix)
            tokens = np.concatenate([PREFIXES[which], rng.integers(0, VOCAB, suffix + 8)]).astype(np.int64)
            prompt = PREFIX + suffix
            if not self.alloc.can_admit(tokens[:prompt], PREFIX, 0):
                return
            rid, self.next = self.next, self.next + 1
            cached = self.alloc.admit(rid, tokens[:prompt], PREFIX)
            got = self._sync()
            on_path = set(path_slots(self.alloc.requests.get(rid).node).tolist())
            for t in got:
                if t.direction == "to_gpu" and not set(t.gpu_slots.tolist()) <= on_path:
                    raise AssertionError(f"request {rid}: a prefetched run is not restored in the radix index")
            self.reqs[rid] = dict(tokens=tokens, prompt=prompt, done=cached)
            self._write(rid, prompt - cached)
            self.alloc.cache_prefix(rid, tokens[:PREFIX])
            self._sync()

        @rule(pick=st.integers(0, 50))
        def decode(self, pick):
            rids = sorted(r for r, q in self.reqs.items() if q["done"] < q["tokens"].size)
            if rids and self.alloc.can_extend({rids[pick % len(rids)]: 1}):
                self._write(rids[pick % len(rids)], 1)

        @rule(pick=st.integers(0, 50), cache=st.booleans())
        def finish(self, pick, cache):
            if self.reqs:
                rid = sorted(self.reqs)[pick % len(self.reqs)]
                r = self.reqs.pop(rid)
                self.alloc.release(rid, r["tokens"][: r["done"]] if cache else None)
                self._sync()

        @rule(n=st.integers(1, 80))
        def evict(self, n):
            self.alloc.evict(n)
            self._sync()

        @rule()
        def flush(self):
            self.alloc.clear_cache()
            self._sync()

        @invariant()
        def tier_holds(self):
            check_host_tier(self.alloc, self.host)
            for rid, r in self.reqs.items():
                slots = self.alloc.layout(rid).slots()
                if not np.array_equal(self.gpu[slots], r["tokens"][: r["done"]]):
                    raise AssertionError(f"request {rid}: its layout reads other KV (a run read while on host?)")

    return HostTierMachine


def _run(name: str, examples: int, phases=tuple(Phase)) -> None:
    run_state_machine_as_test(machine(name), settings=settings(
        max_examples=examples, stateful_step_count=30, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck), phases=phases))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_host_tier_fuzz(name):
    _run(name, EXAMPLES)


def _no_copy(self, gpu_slots, host_slots, contiguous):  # planted: the prefetch moves nothing
    self.prefetches += 1


def _no_restore(self, seq, tokens):  # planted: the slab is filled by copy but stays the request's own
    ht = self.host_tier
    ht.note_admission(tokens)
    length, host_slots, _ = ht.match(tokens, tokens.size - 1)
    if seq.slab is not None and length >= seq.cached_len + seq.slab_len:
        s0, _ = self.hot.span(seq.slab)
        ht.prefetch(np.arange(s0, s0 + seq.slab_len), host_slots[seq.cached_len : seq.cached_len + seq.slab_len], True)


@pytest.mark.parametrize("bug, target, attr, name", [
    ("slab read while on host", host_tier_mod.HostTier, "prefetch", "granikv-slabs"),
    ("pages read while on host", host_tier_mod.HostTier, "prefetch", "token"),
    ("prefetch forgets the radix node", KVAllocator, "_prefetch", "granikv-slabs"),
])
def test_planted_bugs_are_caught(monkeypatch, bug, target, attr, name):
    monkeypatch.setattr(target, attr, _no_copy if attr == "prefetch" else _no_restore)
    with pytest.raises(AssertionError):  # found is enough: no shrinking
        _run(name, 200, phases=(Phase.generate,))
