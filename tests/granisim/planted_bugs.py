"""Allocators with one deliberate bug each: the fuzzer must catch every one of them."""

from __future__ import annotations

from granisim.experiments.fuzz import FUZZ_CAPACITY, FUZZ_HOT_FRACTION
from granisim.kv.allocator import KVAllocator
from granisim.kv.hot_pool import HotPool
from granisim.kv.hot_slabs import HotSlabs
from granisim.kv.radix import RadixIndex


class DoubleFree(KVAllocator):
    """Caching a request's private tokens also frees them, though the radix tree now owns
    them: the tree's eventual eviction frees them a second time."""

    def _cache_private(self, seq, tokens):
        k = tokens.size - seq.cached_len
        handed = seq.priv[:k].copy()
        super()._cache_private(seq, tokens)
        self.store.release(handed)  # BUG


class OffByOneHotPool(HotPool):
    def allocate(self, n):
        slab = super().allocate(n)
        if slab is not None and n > 1:
            start, length = self._slabs[slab]
            self._insert_free(start + length - 1, 1)  # the slab's last slot is also handed out as free
        return slab


class OffByOneSlabEnd(KVAllocator):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.hot.__class__ = OffByOneHotPool  # the pool every part holds, still empty


class EvictsLockedRadix(RadixIndex):
    def evictable_leaves(self, pool=None):
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif n is not self.root and (pool is None or n.pool == pool):
                out.append(n)  # BUG: ignores lock_ref
        return out

    def remove_leaf(self, leaf):
        saved = leaf.lock_ref
        leaf.lock_ref = 0
        self._account(leaf, -1)
        leaf.lock_ref = saved
        del leaf.parent.children[self._child_key(leaf.key)]
        self.num_nodes -= 1


class EvictsLockedNode(KVAllocator):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.radix.__class__ = EvictsLockedRadix  # the index every part holds, still empty


class LosesSlotOnSplitRadix(RadixIndex):
    def _split(self, child, m):
        head = super()._split(child, m)
        if head.pool != "hot" and len(head) > 1:
            head.value = head.value.copy()
            head.value[-1] = head.value[0]  # BUG: the head's last slot is replaced, the real one is lost
        return head


class LosesSlotOnSplit(KVAllocator):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.radix.__class__ = LosesSlotOnSplitRadix  # the index every part holds, still empty


class StaleLayoutHotSlabs(HotSlabs):
    def compact(self):
        copies = self.pool.compact()  # BUG: node values keep pointing at the old slab positions
        self._copies.extend(copies)
        return copies


class StaleLayoutAfterCompaction(KVAllocator):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.hot_slabs.__class__ = StaleLayoutHotSlabs


def _hot(cls):
    return lambda: cls("granikv", FUZZ_CAPACITY, hot_fraction=FUZZ_HOT_FRACTION)


def _tok(cls):
    return lambda: cls("token", FUZZ_CAPACITY)


class WrongHitCounter(KVAllocator):
    """Counts one cached token too few per admission (a wrong counter: the allocator's own
    invariants hold, the reference model's counters differ)."""

    def admit(self, rid, tokens, shared_len=0):
        cached = super().admit(rid, tokens, shared_len)
        if cached:
            self.counters.hit_tokens -= 1  # BUG
        return cached


class OverAdmits(KVAllocator):
    """Forgets the scheduler's reserve when admitting: a yes it cannot keep."""

    def can_admit(self, tokens, shared_len=0, reserve=0):
        return super().can_admit(tokens, shared_len, 0)  # BUG


class BatchedDecodeForgetsGrowth(KVAllocator):
    """The batched decode path hands out slots but does not record that the requests grew."""

    def extend_all(self, rids, n):
        seqs = [self.requests.get(r) for r in rids]
        before = [q.n_new for q in seqs]
        out = super().extend_all(rids, n)
        if len(rids) > 1:
            seqs[-1].n_new = before[-1]  # BUG
        return out


PLANTED = {
    "double_free": _tok(DoubleFree),
    "off_by_one_slab_end": _hot(OffByOneSlabEnd),
    "evicts_locked_node": _tok(EvictsLockedNode),
    "slot_lost_on_split": _tok(LosesSlotOnSplit),
    "stale_layout_after_compaction": _hot(StaleLayoutAfterCompaction),
    "wrong_hit_counter": _tok(WrongHitCounter),
    "over_admits": _tok(OverAdmits),
    "batched_decode_forgets_growth": _tok(BatchedDecodeForgetsGrowth),
}

# the fuzz policy (reference model) each planted bug runs against
PLANTED_POLICY = {name: "granikv" if name in ("off_by_one_slab_end", "stale_layout_after_compaction") else "token"
                  for name in PLANTED}
