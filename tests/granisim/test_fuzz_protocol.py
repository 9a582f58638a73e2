"""Fuzzing a third-party allocator written only against ``granisim.kv.protocol``.

``ToyAllocator`` is what a user would bring: its own slot list, its own bookkeeping, no
granisim pools, no prefix cache (the protocol allows that: ``cached_runs`` is empty and
``lookup`` matches nothing). ``allocator_machine(ToyAllocator)`` fuzzes it with every
invariant (there is no reference model for someone else's policy). The two broken
variants below show the fuzzer biting on it: a slot leaked on release and a ``can_admit``
that forgets the reserve (over-admission).
"""

import hypothesis
import numpy as np
import pytest
from hypothesis import Phase
from hypothesis.stateful import run_state_machine_as_test

from granisim.experiments.fuzz import PromiseBroken, allocator_machine, fuzz_settings
from granisim.kv.layout import AllocatorStats, KVSegment, PoolStats, RequestLayout
from granisim.kv.protocol import AllocatorProtocol


class ToyAllocator:
    """A LIFO free list of slots; every request owns the slots it wrote, nothing is cached."""

    page_size = 1

    def __init__(self, capacity: int = 96):
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))
        self._reqs: dict[int, list[int]] = {}
        self._admitted = 0

    # what the scheduler asks
    def can_admit(self, tokens, shared_len=0, reserve=0):
        return len(tokens) + reserve <= len(self._free)

    def admit(self, rid, tokens, shared_len=0):
        self._reqs[rid] = []
        self._admitted += 1
        return 0  # nothing is ever cached

    def can_extend(self, demands):
        return sum(demands.values()) <= len(self._free)

    def extend(self, rid, n):
        if n > len(self._free):
            raise MemoryError(f"request {rid}: {n} slots wanted, {len(self._free)} free")
        got = [self._free.pop() for _ in range(n)]
        self._reqs[rid] += got
        return np.array(got, np.int64)

    def can_extend_all(self, rids, n):
        return self.can_extend({r: n for r in rids})

    def extend_all(self, rids, n):
        return [self.extend(r, n) for r in rids]

    def cache_prefix(self, rid, tokens):
        pass

    def release(self, rid, tokens=None):
        self._free.extend(self._reqs.pop(rid))

    def evict(self, n):
        return 0

    def clear_cache(self):
        return 0

    def compact(self):
        return []

    def take_copies(self):
        return []

    def rebalance(self):
        pass

    def layout(self, rid):
        slots = np.array(self._reqs[rid], np.int64)
        return RequestLayout(rid, (KVSegment("toy", slots),) if slots.size else (), int(slots.size), 0, None)

    def stats(self):
        free = len(self._free)
        pools = {"toy": PoolStats(self.capacity, free, self.capacity - free, 0, 0.0)}
        return AllocatorStats("toy", pools, lookups=self._admitted, hit_tokens=0, lookup_tokens=0, evictions=0,
                              evicted_tokens=0, compactions=0, copied_tokens=0, hot_placements=0, hot_fallbacks=0,
                              hot_evictions=0)

    # what the fuzzer reads
    def lookup(self, tokens):
        return np.empty(0, np.int64)

    def ownership(self):
        return [("request", rid, "toy", np.array(s, np.int64)) for rid, s in self._reqs.items() if s]

    def cached_runs(self):
        return []

    def free_slots(self):
        return {"toy": np.array(self._free, np.int64)}

    def pool_bounds(self):
        return {"toy": (0, self.capacity)}


class LeaksOnRelease(ToyAllocator):
    def release(self, rid, tokens=None):
        self._free.extend(self._reqs.pop(rid)[1:])  # BUG: the first slot is never returned


class OverAdmits(ToyAllocator):
    def can_admit(self, tokens, shared_len=0, reserve=0):
        return len(tokens) <= len(self._free)  # BUG: the reserve is not counted


def test_toy_allocator_implements_the_protocol():
    assert isinstance(ToyAllocator(), AllocatorProtocol)


def test_toy_allocator_survives_fuzzing():
    machine = allocator_machine(ToyAllocator)
    hypothesis.seed(3)(machine)
    run_state_machine_as_test(machine, settings=fuzz_settings(100))


@pytest.mark.parametrize("broken, error, message", [(LeaksOnRelease, AssertionError, "lost|not returned"),
                                                    (OverAdmits, PromiseBroken, "over-admission")])
def test_fuzzer_bites_on_a_broken_toy(broken, error, message):
    machine = allocator_machine(broken)
    hypothesis.seed(3)(machine)
    settings = hypothesis.settings(fuzz_settings(300, report_multiple=False), phases=[Phase.generate])
    with pytest.raises(error, match=message):
        run_state_machine_as_test(machine, settings=settings)
