"""The allocator interface the scheduler uses, and its three policies.

Policies (one class, three configurations — see :func:`make_allocator`):

* ``granikv`` — HOT pool of contiguous slabs (``hot_fraction`` of the budget) for shared
  prefixes + COLD pool (page size 1) for everything else.
* ``token`` — page size 1 everywhere (SGLang's default).
* ``paged`` — pages of ``page_size`` everywhere (vLLM's default is 16); matching and
  caching are floored to whole pages.

``KVAllocator`` is assembled from pieces that each hold one concept: this module keeps
admission, growth and caching/release; :mod:`granisim.kv.eviction` eviction; :mod:`granisim.kv.hot_slabs` the HOT
slab placement, compaction and the adaptive HOT boundary (``granikv`` only);
:mod:`granisim.kv.views` the layouts and reports; :mod:`granisim.kv.sequence` the
per-request record.

Request life cycle: ``admit`` (match + lock cached prefix, reserve a slab) → ``extend``
per prefill chunk / decode token → ``cache_prefix`` once the declared prefix is computed
(it becomes matchable by others) → ``release`` (finish: cache everything computed; or
preempt: free). Every slot is at all times exactly one of free, owned by a live request,
or owned by a radix node (locked = used, unlocked = cached).
"""

from __future__ import annotations

import numbers

import numpy as np

from granisim.kv.cold_pool import ColdPool
from granisim.kv.elastic import ElasticColdPool, ElasticHotPool
from granisim.kv.eviction import Eviction
from granisim.kv.hot_pool import HotPool, KVCopy
from granisim.kv.hot_slabs import DEMAND_WINDOW, HOT_HEADROOM, HotSlabs
from granisim.kv.paged_pool import PagedPool
from granisim.kv.radix import TOKEN_DTYPE, RadixIndex, RadixNode, path_to
from granisim.kv.sequence import _EMPTY, _Seq
from granisim.kv.stores import PageStore, TokenStore
from granisim.kv.views import AllocatorViews

__all__ = ["POLICIES", "DEMAND_WINDOW", "HOT_HEADROOM", "OutOfKVMemory", "KVAllocator", "make_allocator"]

POLICIES = ("granikv", "token", "paged")


class OutOfKVMemory(RuntimeError):
    """Not enough free or evictable KV slots; the scheduler should have asked first."""


class KVAllocator(HotSlabs, Eviction, AllocatorViews):
    def __init__(self, policy: str, capacity: int, *, hot_fraction: float | str = 0.2, page_size: int = 16,
                 demand_window: int = DEMAND_WINDOW):
        if policy not in POLICIES:
            raise ValueError(f"unknown allocator policy {policy!r}; choose one of {', '.join(POLICIES)}")
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity <= 0:
            raise ValueError(f"KV capacity must be a positive integer number of tokens, got {capacity!r}")
        self.adaptive = hot_fraction == "adaptive"
        if not self.adaptive and (isinstance(hot_fraction, bool) or not (
                isinstance(hot_fraction, numbers.Real) and 0.0 <= hot_fraction <= 1.0)):
            raise ValueError(f"hot_fraction must be within [0, 1] or 'adaptive', got {hot_fraction!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        self.policy = policy
        self.capacity = int(capacity)
        self.hot: HotPool | None = None
        if policy == "granikv" and self.adaptive:
            self.hot = ElasticHotPool(0, 0)
            self.store = TokenStore(ElasticColdPool(self.capacity, 0, name="cold"))
        elif policy == "granikv":
            hot_cap = int(self.capacity * hot_fraction)
            self.hot = HotPool(hot_cap, 0)
            self.store = TokenStore(ColdPool(self.capacity - hot_cap, hot_cap, name="cold"))
        elif policy == "token":
            self.store = TokenStore(ColdPool(self.capacity, 0, name="token"))
        else:
            self.store = PageStore(PagedPool(self.capacity, page_size, 0))
        self.page_size = self.store.page_size
        self.radix = RadixIndex(self.page_size, on_split=self._on_split)
        self._seqs: dict[int, _Seq] = {}
        self._slab_owner: dict[int, RadixNode | _Seq] = {}
        self._copies: list[KVCopy] = []
        self._n = dict(lookups=0, hit_tokens=0, lookup_tokens=0, evictions=0, evicted_tokens=0,
                       hot_placements=0, hot_fallbacks=0, hot_evictions=0)
        # adaptive HOT: shared prefix (hash of its tokens) -> (length, admission count when last asked)
        self._demand: dict[int, tuple[int, int]] = {}
        self._admissions = 0
        self._demand_window = demand_window
        self._drained_at = -1
        self._hyst = max(1, self.capacity // 64)

    # ---- admission ------------------------------------------------------------------------
    def can_admit(self, tokens: np.ndarray, shared_len: int = 0, reserve: int = 0) -> bool:
        """Would the whole uncached prompt plus ``reserve`` more tokens fit right now?"""
        tokens = np.asarray(tokens, TOKEN_DTYPE)
        m = self.radix.match_prefix(tokens, tokens.size - 1)
        need = tokens.size - m.length + reserve
        if self.adaptive and shared_len:
            self._note_demand(tokens, shared_len)
        if self._wants_slab(shared_len, m.length, tokens.size):
            n = shared_len - m.length
            if self.adaptive:
                self._grow_hot(n, need - n, m)
            if self.hot.free + self.radix.evictable.get("hot", 0) >= n:
                need -= n
        on_path = sum(len(n) for n in m.path() if n.lock_ref == 0 and n.pool == self.store.name)
        avail = self.store.free + self.radix.evictable.get(self.store.name, 0) - on_path
        return self.store.need(0, need) <= avail

    def admit(self, rid: int, tokens: np.ndarray, shared_len: int = 0) -> int:
        """Start a request: lock its longest cached prefix; returns the cached length."""
        if rid in self._seqs:
            raise ValueError(f"request id {rid} is already admitted")
        tokens = np.asarray(tokens, TOKEN_DTYPE)
        if tokens.size < 1:
            raise ValueError(f"request {rid} has an empty prompt")
        if not 0 <= shared_len <= tokens.size:
            raise ValueError(f"request {rid}: shared_len {shared_len} outside [0, {tokens.size}]")
        m = self.radix.match_prefix(tokens, tokens.size - 1)  # at least one token is computed
        if self.adaptive and shared_len:
            self._note_demand(tokens, shared_len)
            self._admissions += 1
        self.radix.lock(m.node)
        self._n["lookups"] += 1
        self._n["hit_tokens"] += m.length
        self._n["lookup_tokens"] += tokens.size
        seq = _Seq(rid, m.node, m.length, shared_len)
        self._seqs[rid] = seq
        if self._wants_slab(shared_len, m.length, tokens.size):
            n = shared_len - m.length
            if self._make_hot_room(n):
                seq.slab, seq.slab_len = self.hot.allocate(n), n
                self._slab_owner[seq.slab] = seq
                self._n["hot_placements"] += 1
            else:
                self._n["hot_fallbacks"] += 1
        self._update_group(seq)
        return m.length

    # ---- growth ---------------------------------------------------------------------------
    def extend_need(self, rid: int, n: int) -> int:
        """Private-pool tokens that ``extend(rid, n)`` would take (0 while a slab has room)."""
        seq = self._seq(rid)
        from_priv = n - min(n, seq.slab_len - min(seq.n_new, seq.slab_len))
        return self.store.need(seq.priv.size - seq.n_priv, from_priv)

    def available(self) -> int:
        """Private-pool tokens obtainable now: free plus evictable cached."""
        return self.store.free + self.radix.evictable.get(self.store.name, 0)

    def can_extend(self, demands: dict[int, int]) -> bool:
        return sum(self.extend_need(r, n) for r, n in demands.items()) <= self.available()

    def _uniform(self, seqs: list[_Seq]) -> bool:
        """Page size 1 and no slab being filled: every new token takes one pool slot."""
        if self.page_size != 1:
            return False
        return all(q.n_new >= q.slab_len for q in seqs) if self._n["hot_placements"] else True

    def can_extend_all(self, rids: list[int], n: int) -> bool:
        """``can_extend`` for ``n`` more tokens of every request in ``rids`` (fast path)."""
        seqs = [self._seq(r) for r in rids]
        if self._uniform(seqs):
            return n * len(seqs) <= self.available()
        return self.can_extend({r: n for r in rids})

    def extend_all(self, rids: list[int], n: int) -> list[np.ndarray]:
        """``extend(rid, n)`` for every request, with one pool call when possible (decode steps)."""
        seqs = [self._seq(r) for r in rids]
        if n < 0 or not seqs or not self._uniform(seqs):
            return [self.extend(r, n) for r in rids]
        total = n * len(seqs)
        if total > self.store.free:
            self._evict(self.store.name, total - self.store.free)
            if total > self.store.free:
                raise OutOfKVMemory(f"{len(seqs)} requests need {total} {self.store.name} slots, "
                                    f"{self.store.free} free")
        block = self.store.pool.allocate(total).reshape(len(seqs), n)
        for q, row in zip(seqs, block):
            hi = q._hi
            if hi + n <= q._buf.size:  # push() inlined: this loop runs for every decode step
                q._buf[hi : hi + n] = row
                q._hi = hi + n
            else:
                q.push(row)
            q.n_new += n
        return list(block)

    def extend(self, rid: int, n: int) -> np.ndarray:
        """Slots for the next ``n`` tokens of ``rid`` (for the executor's KV write)."""
        if n < 0:
            raise ValueError(f"request {rid}: cannot extend by {n} tokens")
        seq = self._seq(rid)
        filled = min(seq.n_new, seq.slab_len)
        from_slab = min(n, seq.slab_len - filled)
        from_priv = n - from_slab
        need = self.store.need(seq.priv.size - seq.n_priv, from_priv)
        if need > self.store.free:
            self._evict(self.store.name, need - self.store.free)
            if need > self.store.free:
                raise OutOfKVMemory(f"request {rid}: needs {need} {self.store.name} slots, {self.store.free} free")
        spare = seq.priv.size - seq.n_priv
        new = self.store.reserve(spare, from_priv)
        if new.size:
            seq.push(new)
        start = seq.n_priv
        out = []
        if from_slab:
            s0, _ = self.hot.span(seq.slab)
            out.append(np.arange(s0 + filled, s0 + filled + from_slab, dtype=np.int64))
        out.append(seq.priv[start : start + from_priv])
        seq.n_new += n
        return np.concatenate(out) if len(out) > 1 else out[0].copy()

    # ---- caching and release --------------------------------------------------------------
    def cache_prefix(self, rid: int, tokens: np.ndarray) -> None:
        """Make the request's first ``len(tokens)`` computed tokens matchable by others.

        With a reserved slab, nothing is cached until the whole slab is computed. The
        request keeps them locked. Slots that duplicate what is already cached are freed.
        """
        seq = self._seq(rid)
        tokens = np.asarray(tokens, TOKEN_DTYPE)
        if tokens.size > seq.num_tokens:
            raise ValueError(f"request {rid}: cannot cache {tokens.size} tokens, only {seq.num_tokens} computed")
        end = tokens.size - tokens.size % self.page_size
        if seq.slab is not None:
            slab_end = seq.cached_len + seq.slab_len
            if end < slab_end:
                return
            self._cache_slab(seq, tokens[:slab_end])
        if end > seq.cached_len:
            self._cache_private(seq, tokens[:end])
        self._update_group(seq)

    def _cache_private(self, seq: _Seq, tokens: np.ndarray) -> None:
        k = tokens.size - seq.cached_len
        slots = np.concatenate([self._path_slots(seq.node), seq.priv[:k]])
        node, already = self.radix.insert(tokens, slots, self.store.name)
        dup = max(0, already - seq.cached_len)
        if dup:
            self.store.release(seq.priv[:dup])
        self._relock(seq, node, tokens.size)
        seq.drop_front(k)
        seq.n_new -= k

    def _relock(self, seq: _Seq, node: RadixNode, cached_len: int) -> None:
        self.radix.lock(node)
        self.radix.unlock(seq.node)
        seq.node, seq.cached_len = node, cached_len

    def release(self, rid: int, tokens: np.ndarray | None = None) -> None:
        """End a request. With ``tokens`` (finished), cache its computed tokens first;
        without (preempted / aborted), just free its private slots."""
        seq = self._seq(rid)
        if tokens is not None:
            tokens = np.asarray(tokens, TOKEN_DTYPE)[: seq.num_tokens]
            if seq.slab is not None and seq.n_new < seq.slab_len:
                tokens = tokens[: seq.cached_len]  # slab never filled: nothing new to cache
            self.cache_prefix(rid, tokens)
        if seq.slab is not None:
            del self._slab_owner[seq.slab]
            self.hot.release(seq.slab)
        if seq.priv.size:
            self.store.release(seq.priv)
        self.radix.unlock(seq.node)
        del self._seqs[rid]

    # ---- lookups --------------------------------------------------------------------------
    def _seq(self, rid: int) -> _Seq:
        try:
            return self._seqs[rid]
        except KeyError:
            raise ValueError(f"unknown request id {rid!r} (never admitted or already released)") from None

    @staticmethod
    def _path_slots(node: RadixNode) -> np.ndarray:
        vals = [n.value for n in path_to(node)]
        return np.concatenate(vals) if vals else _EMPTY


def make_allocator(policy: str, capacity: int, *, hot_fraction: float | str = 0.2, page_size: int | None = None,
                   demand_window: int = DEMAND_WINDOW) -> KVAllocator:
    """``policy`` is ``granikv``, ``token``, ``paged`` or ``pagedN`` (e.g. ``paged16``)."""
    if policy.startswith("paged") and policy != "paged":
        digits = policy[len("paged"):]
        if not digits.isdigit():
            raise ValueError(f"unknown allocator policy {policy!r}; use paged<N>, e.g. paged16")
        return KVAllocator("paged", capacity, page_size=int(digits))
    return KVAllocator(policy, capacity, hot_fraction=hot_fraction,
                       page_size=16 if page_size is None else page_size, demand_window=demand_window)
