"""The allocator interface the scheduler uses, and its three policies.

Policies (one class, three configurations — see :func:`make_allocator`):

* ``granikv`` — HOT pool of contiguous slabs (``hot_fraction`` of the budget) for shared
  prefixes + COLD pool (page size 1) for everything else.
* ``token`` — page size 1 everywhere (SGLang's default).
* ``paged`` — pages of ``page_size`` everywhere (vLLM's default is 16); matching and
  caching are floored to whole pages.

Who owns what. ``KVAllocator`` keeps admission, growth and caching/release, and owns its
parts, each built once in ``__init__`` and called by plain method calls:

* ``store`` (:mod:`granisim.kv.stores`) — the private pool every request grows into;
  ``hot`` (:mod:`granisim.kv.hot_pool`, ``granikv`` only) — the HOT slab pool. Both come
  from :func:`build_pools`, where a fixed ``hot_fraction`` sets the HOT/COLD split.
* ``radix`` (:mod:`granisim.kv.radix`) — the prefix index; with a HOT pool its
  ``on_split`` is :func:`granisim.kv.hot_slabs.slab_splitter`.
* ``requests`` (:class:`granisim.kv.sequence.Requests`) — the live requests' records.
* ``counters`` (:class:`granisim.kv.counters.AllocatorCounters`) — event counts, shared
  with the parts that count.
* ``eviction`` (:class:`granisim.kv.eviction.Eviction`) — frees cached nodes, LRU first.
* ``hot_slabs`` (:class:`granisim.kv.hot_slabs.HotSlabs`, ``granikv`` only, else None) —
  slab placement, compaction and its KV copies; with ``hot_fraction="adaptive"`` it holds
  a :class:`granisim.kv.hot_demand.HotDemand` and moves the HOT/COLD boundary.
* ``views`` (:class:`granisim.kv.views.AllocatorViews`) — layouts and reports; the
  allocator's read methods forward to it.

Request life cycle: ``admit`` (match + lock cached prefix, reserve a slab) → ``extend``
per prefill chunk / decode token → ``cache_prefix`` once the declared prefix is computed
(it becomes matchable by others) → ``release`` (finish: cache everything computed; or
preempt: free). Every slot is at all times exactly one of free, owned by a live request,
or owned by a radix node (locked = used, unlocked = cached).
"""

from __future__ import annotations

import numbers

import numpy as np

from granisim.kv.cold_pool import ColdPool, CountingColdPool
from granisim.kv.counters import AllocatorCounters
from granisim.kv.elastic import ElasticColdPool, ElasticHotPool
from granisim.kv.eviction import Eviction
from granisim.kv.hot_demand import DEMAND_WINDOW, HotDemand
from granisim.kv.hot_pool import HotPool, KVCopy
from granisim.kv.hot_slabs import HOT_HEADROOM, HotSlabs, slab_splitter
from granisim.kv.host_tier import HostTier, HostTierConfig, KVTransfer
from granisim.kv.layout import AllocatorStats, RequestLayout
from granisim.kv.paged_pool import PagedPool
from granisim.kv.protocol import CachedRun
from granisim.kv.radix import TOKEN_DTYPE, RadixIndex, RadixNode
from granisim.kv.reserve import LazyReserve
from granisim.kv.reserve import exact as exact_reserve
from granisim.kv.sequence import GrowthClock, Requests, _CountedSeq, _Seq, path_slots
from granisim.kv.stores import PageStore, TokenStore
from granisim.kv.views import AllocatorViews, prefix_group_of

__all__ = ["POLICIES", "DEMAND_WINDOW", "HOT_HEADROOM", "OutOfKVMemory", "KVAllocator", "build_pools",
           "make_allocator"]

POLICIES = ("granikv", "token", "paged")


class OutOfKVMemory(RuntimeError):
    """Not enough free or evictable KV slots; the scheduler should have asked first."""


def build_pools(policy: str, capacity: int, hot_fraction: float | str, page_size: int,
                slot_ids: bool = True) -> tuple[HotPool | None, object]:
    """(HOT pool or None, private store) of a policy. ``granikv`` puts HOT at slots
    ``[0, b)`` and COLD at ``[b, capacity)``: ``b = int(capacity * hot_fraction)``, or 0 to
    start with when adaptive (the boundary then moves, see :mod:`granisim.kv.hot_slabs`).
    ``slot_ids=False``: a fixed COLD / token pool only counts its slots (CountingColdPool)."""
    if policy == "granikv" and hot_fraction == "adaptive":
        return ElasticHotPool(0, 0), TokenStore(ElasticColdPool(capacity, 0, name="cold"))
    cold = ColdPool if slot_ids else CountingColdPool
    if policy == "granikv":
        hot_cap = int(capacity * hot_fraction)
        return HotPool(hot_cap, 0), TokenStore(cold(capacity - hot_cap, hot_cap, name="cold"))
    if policy == "token":
        return None, TokenStore(cold(capacity, 0, name="token"))
    return None, PageStore(PagedPool(capacity, page_size, 0))


class KVAllocator:
    """One policy's KV memory: the scheduler's paired questions (``can_admit``/``admit``,
    ``can_extend``/``extend``, ``release``) over the parts listed in the module docstring."""

    def __init__(self, policy: str, capacity: int, *, hot_fraction: float | str = 0.2, page_size: int = 16,
                 demand_window: int = DEMAND_WINDOW, host: HostTierConfig | None = None, slot_ids: bool = True):
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
        if not slot_ids and host is not None:  # a host tier's transfers move runs of COLD ids
            raise ValueError("a host tier needs the allocator's slot ids (slot_ids=True)")
        self.hot, self.store = build_pools(policy, self.capacity, hot_fraction, page_size, slot_ids)
        self.page_size = self.store.page_size
        self._pool = self.store.pool  # the store's pool, whose ``free`` the hot paths read without the store's
        # one pool slot a token, taken in blocks (a slot pool: pages of one slot are not)
        self._token_slots = self.page_size == 1 and not isinstance(self.store, PageStore)
        self.radix = RadixIndex(self.page_size, on_split=slab_splitter(self.hot) if self.hot is not None else None)
        self.requests = Requests()
        self.counters = AllocatorCounters()
        # host-memory tier (granisim.kv.host_tier); None: evicted KV is dropped, as without one
        self.host_tier = HostTier(host, self.page_size) if host is not None else None
        self.eviction = Eviction(self.radix, self.store, self.hot, self.counters, host=self.host_tier)
        self.hot_slabs: HotSlabs | None = None
        if self.hot is not None:
            demand = HotDemand(demand_window) if self.adaptive else None
            self.hot_slabs = HotSlabs(self.hot, self.radix, self.store, self.eviction, self.counters,
                                      budget=self.capacity, demand=demand)
        self.views = AllocatorViews(policy, self.requests, self.store, self.hot, self.radix, self.counters)
        if self.host_tier is not None and self.hot_slabs is not None:
            self.host_tier.copies_queued = lambda: len(self.hot_slabs._copies)
        # live requests with a HOT slab not yet filled (grow's fast-path test; may hold stale entries)
        self._filling: dict[int, _Seq] = {}
        # grow() may count decode slots without picking their ids (a fixed COLD / token pool)
        self._owing = type(self.store.pool) in (ColdPool, CountingColdPool)
        # requests that grow_tracked() extends together (a scheduler's decoding requests), on one clock
        self._growth = GrowthClock()
        self._tracked: dict[int, _Seq] = {}
        # (tokens, prefix, match, radix._next_id, radix.num_nodes) of the last can_admit: the nodes then
        self._asked: tuple | None = None

    # ---- admission ------------------------------------------------------------------------
    def can_admit(self, tokens: np.ndarray, shared_len: int = 0, reserve: int | LazyReserve = 0,
                  prefix: np.ndarray | None = None) -> bool:
        """Would the whole uncached prompt plus ``reserve`` more tokens fit right now? ``prefix``: an array
        the prompt starts with (its role's system prompt; see ``RadixIndex.match_prefix``). A
        :class:`~granisim.kv.reserve.LazyReserve` is computed exactly only when its bound does not fit."""
        tokens = np.asarray(tokens, TOKEN_DTYPE)
        radix = self.radix
        m = radix.match_prefix(tokens, tokens.size - 1, prefix)
        self._asked = (tokens, prefix, m, radix._next_id, radix.num_nodes)  # admit(checked=True) may reuse m
        need = tokens.size - m.length
        hot = self.hot_slabs
        if hot is not None and shared_len:  # (no slab is wanted without a declared prefix)
            hot.note_demand(tokens, shared_len)
            if hot.wants_slab(shared_len, m.length, tokens.size):
                n = shared_len - m.length
                cold_need = 0  # read by adaptive HOT only: it grows by the COLD tokens needed, reserve included
                if hot.demand is not None:
                    reserve = exact_reserve(reserve)
                    cold_need = need + reserve - n
                if hot.can_place(n, cold_need, m):
                    need -= n
        # (nothing matched: the path is empty)
        on_path = sum(len(n) for n in m.path() if n.lock_ref == 0 and n.pool == self.store.name) if m.length else 0
        avail = self._pool.free + self.radix.evictable.get(self.store.name, 0) - on_path
        if isinstance(reserve, LazyReserve):
            if self.store.need(0, need + reserve.bound) <= avail:
                return True
            reserve = reserve.exact()
        return self.store.need(0, need + reserve) <= avail

    def admit(self, rid: int, tokens: np.ndarray, shared_len: int = 0, prefix: np.ndarray | None = None,
              checked: bool = False) -> int:
        """Start a request: lock its longest cached prefix; returns the cached length. ``prefix``: as for
        ``can_admit``. ``checked``: the caller's last ``can_admit`` was about these tokens (the same array,
        unchanged since): if the radix index has the same nodes as then, its match is taken again without
        the walk (``RadixIndex.rematch``)."""
        if rid in self.requests:
            raise ValueError(f"request id {rid} is already admitted")
        tokens = np.asarray(tokens, TOKEN_DTYPE)
        if tokens.size < 1:
            raise ValueError(f"request {rid} has an empty prompt")
        if not 0 <= shared_len <= tokens.size:
            raise ValueError(f"request {rid}: shared_len {shared_len} outside [0, {tokens.size}]")
        radix, asked = self.radix, self._asked
        self._asked = None
        if (checked and asked is not None and asked[0] is tokens and asked[1] is prefix
                and asked[3] == radix._next_id and asked[4] == radix.num_nodes):
            m = radix.rematch(asked[2])
        else:
            m = radix.match_prefix(tokens, tokens.size - 1, prefix)  # at least one token is computed
        hot = self.hot_slabs
        if hot is not None and shared_len:
            hot.note_demand(tokens, shared_len, admitted=True)
        self.radix.lock(m.node)
        self.counters.lookups += 1
        self.counters.hit_tokens += m.length
        self.counters.lookup_tokens += tokens.size
        pool = self.store.pool
        if type(pool) is CountingColdPool:  # its slots are counted, not named
            seq = _CountedSeq(rid, m.node, m.length, shared_len, pool._ids)
        else:
            seq = _Seq(rid, m.node, m.length, shared_len)
        if self._owing:
            seq._owed_pool = self.store.pool  # grow() may count its decode slots
        self.requests.add(seq)
        if hot is not None and shared_len and hot.wants_slab(shared_len, m.length, tokens.size):
            hot.place(seq, shared_len - m.length)
            if seq.slab is not None:
                self._filling[rid] = seq
        if self.host_tier is not None:
            self._prefetch(seq, tokens)
        seq.group = prefix_group_of(seq, self.page_size)
        return seq.cached_len

    def _prefetch(self, seq: _Seq, tokens: np.ndarray) -> None:
        """Host tier: copy back what the host holds beyond the GPU match instead of recomputing
        it, and put it into the radix index at once (the node is restored, matchable)."""
        ht = self.host_tier
        ht.note_admission(tokens)
        length, host_slots, host_node = ht.match(tokens, tokens.size - 1)
        cached = seq.cached_len
        if length <= cached:
            return
        ht.index.lock(host_node)  # no write-back below may reuse these host slots
        try:
            if seq.slab is not None:  # the declared prefix waits for its slab: fill it by one copy
                end = cached + seq.slab_len
                if length < end:
                    return
                s0, _ = self.hot.span(seq.slab)
                ht.prefetch(np.arange(s0, s0 + seq.slab_len, dtype=np.int64), host_slots[cached:end], True)
                seq.n_new = seq.slab_len
                node = self.hot_slabs.cache_slab(seq, tokens[:end])
                self._relock(seq, node, end)
                seq.n_new -= seq.slab_len
                seq.slab, seq.slab_len = None, 0
                cached = end
            if ht.cfg.mode == "slabs":
                return
            n = length - cached
            if n <= 0 or self.extend_need(seq.rid, n) > self.available():
                return
            new = self.extend(seq.rid, n)
            ht.prefetch(new, host_slots[cached:length], False)
            self._cache_private(seq, tokens[:length])
        finally:
            ht.index.unlock(host_node)

    # ---- growth ---------------------------------------------------------------------------
    def extend_need(self, rid: int, n: int) -> int:
        """Private-pool tokens that ``extend(rid, n)`` would take (0 while a slab has room)."""
        seq = self.requests.get(rid)
        from_priv = n - min(n, seq.slab_len - min(seq.n_new, seq.slab_len))
        return self.store.need(seq.priv.size - seq.n_priv, from_priv)

    def available(self) -> int:
        """Private-pool tokens obtainable now: free plus evictable cached."""
        return self._pool.free + self.radix.evictable.get(self.store.name, 0)

    def can_extend(self, demands: dict[int, int]) -> bool:
        return sum(self.extend_need(r, n) for r, n in demands.items()) <= self.available()

    def _uniform(self, seqs: list[_Seq]) -> bool:
        """Page size 1 in a slot pool (not pages of one slot: a page pool takes no block of slots in one
        call) and no slab being filled: every new token takes one pool slot."""
        if not self._token_slots:
            return False
        return all(q.n_new >= q.slab_len for q in seqs) if self.counters.hot_placements else True

    def can_extend_all(self, rids: list[int], n: int) -> bool:
        """``can_extend`` for ``n`` more tokens of every request in ``rids`` (fast path)."""
        seqs = [self.requests.get(r) for r in rids]
        if self._uniform(seqs):
            return n * len(seqs) <= self.available()
        return self.can_extend({r: n for r in rids})

    def _uniform_ids(self, rids: list[int]) -> bool:
        """``_uniform`` of these live requests, from the few with a HOT slab still being filled."""
        if self._token_slots and not self._filling:  # the common case
            return True
        if not self._uniform(()):  # the page-size test
            return False
        filling = self._filling
        if filling:
            live = self.requests._seqs
            for rid, q in list(filling.items()):
                if live.get(rid) is not q or q.slab is None or q.n_new >= q.slab_len:
                    del filling[rid]
            if filling and not filling.keys().isdisjoint(rids):
                return False
        return True

    def can_grow(self, rids: list[int], n: int) -> bool:
        """``can_extend_all(rids, n)`` for live requests (not checked), without a per-request pass when
        every new token takes one pool slot."""
        if self._uniform_ids(rids):
            return n * len(rids) <= self.available()
        return self.can_extend({r: n for r in rids})

    def grow(self, rids: list[int], n: int) -> None:
        """``extend_all(rids, n)`` for live requests (not checked) whose new slot ids nobody reads now:
        with a fixed token-granular pool the slots are counted at once (free, eviction and every count
        as with ``extend_all``) and their ids picked when the request's slots are next read
        (``_Seq.settle``). The GPU executor, which writes K/V into the slots, uses ``extend_all``."""
        if n <= 0 or not rids or not self._owing or not self._uniform_ids(rids):
            self.extend_all(rids, n)
            return
        self._owe(len(rids), n * len(rids))
        live = self.requests._seqs
        for rid in rids:
            q = live[rid]
            q.owed += n
            q.n_new += n

    def track(self, rid: int) -> None:
        """``rid`` joins the tracked requests (see ``grow_tracked``)."""
        q = self.requests.get(rid)
        if q._growth is not None:
            raise ValueError(f"request {rid} is already tracked")
        q._growth, q._gat = self._growth, self._growth.now
        self._tracked[rid] = q

    def untrack(self, rid: int) -> None:
        """``rid`` leaves the tracked requests (a released request leaves them too)."""
        q = self._tracked.pop(rid)
        q.sync()
        q._growth = None

    def grow_tracked(self, rids: list[int], n: int) -> None:
        """``grow(rids, n)`` where ``rids`` are the tracked requests (in the order ``grow`` would take
        them): while slots are only counted, once for all of them (each catches up when read)."""
        k = len(rids)
        if k != len(self._tracked):
            raise ValueError(f"grow_tracked: {k} requests given, {len(self._tracked)} tracked")
        if n <= 0 or not k or not self._owing or not self._uniform_ids(rids):
            self.extend_all(rids, n)
            return
        self._owe(k, n * k)
        self._growth.now += n

    def _owe(self, requests: int, total: int) -> None:
        """Count ``total`` pool slots as taken (evicting first if short); their ids are picked later."""
        pool = self._pool
        free = pool.free
        if total > free:
            self.eviction.evict(self.store.name, total - free)
            if total > pool.free:
                raise OutOfKVMemory(f"{requests} requests need {total} {self.store.name} slots, {pool.free} free")
        pool.owe(total)

    def settle(self) -> None:
        """Pick the ids of every owed slot (before reading the pools' free slots)."""
        for q in self.requests:
            if q.owed:
                q.settle()

    def extend_all(self, rids: list[int], n: int) -> list[np.ndarray]:
        """``extend(rid, n)`` for every request, with one pool call when possible (decode steps)."""
        seqs = [self.requests.get(r) for r in rids]
        if n < 0 or not seqs or not self._uniform(seqs):
            return [self.extend(r, n) for r in rids]
        total = n * len(seqs)
        if total > self.store.free:
            self.eviction.evict(self.store.name, total - self.store.free)
            if total > self.store.free:
                raise OutOfKVMemory(f"{len(seqs)} requests need {total} {self.store.name} slots, "
                                    f"{self.store.free} free")
        block = self.store.pool.allocate(total).reshape(len(seqs), n)
        for q, row in zip(seqs, block):
            if q.owed:
                q.settle()
            hi = q._hi
            if hi + n <= q._buf.size:  # push() inlined: this loop runs for every decode step
                q._buf[hi : hi + n] = row
                q._hi = hi + n
            else:
                q.push(row)
            q.n_new += n
        return list(block)

    def extend(self, rid: int, n: int, slots: bool = True) -> np.ndarray | None:
        """Slots for the next ``n`` tokens of ``rid`` (for the executor's KV write); ``slots=False``: the same
        allocation, returning None (a caller that reads no slot ids: the cost executor's scheduler)."""
        if n < 0:
            raise ValueError(f"request {rid}: cannot extend by {n} tokens")
        seq = self.requests.get(rid)
        n_new, slab_len = seq.n_new, seq.slab_len
        filled = min(n_new, slab_len)
        from_slab = min(n, slab_len - filled)
        from_priv = n - from_slab
        store = self.store
        spare = seq.priv.size - max(0, n_new - slab_len)  # priv.size - n_priv (eviction changes neither)
        need = store.need(spare, from_priv)
        free = self._pool.free
        if need > free:
            self.eviction.evict(store.name, need - free)
            if need > store.free:
                raise OutOfKVMemory(f"request {rid}: needs {need} {store.name} slots, {store.free} free")
        new = store.reserve(spare, from_priv)
        if new.size:
            seq.push(new)
        if not slots:
            seq.n_new += n
            return None
        start = seq.n_priv
        out = []
        if from_slab:
            s0, _ = self.hot.span(seq.slab)
            out.append(np.arange(s0 + filled, s0 + filled + from_slab, dtype=np.int64))
        out.append(seq.priv[start : start + from_priv])
        seq.n_new += n
        return np.concatenate(out) if len(out) > 1 else out[0].copy()

    # ---- caching and release --------------------------------------------------------------
    def cache_prefix(self, rid: int, tokens: np.ndarray, fixed: bool = False) -> None:
        """Make the request's first ``len(tokens)`` computed tokens matchable by others.

        With a reserved slab, nothing is cached until the whole slab is computed. The
        request keeps them locked. Slots that duplicate what is already cached are freed.
        ``fixed``: the tokens never change afterwards (the radix index may keep a view of them).
        """
        seq = self.requests.get(rid)
        self._cache(seq, tokens, fixed)
        seq.group = prefix_group_of(seq, self.page_size)

    def _cache(self, seq: _Seq, tokens: np.ndarray, fixed: bool) -> None:
        """``cache_prefix`` but for the request's prefix group (which a released request no longer needs)."""
        rid = seq.rid
        tokens = np.asarray(tokens, TOKEN_DTYPE)
        if tokens.size > seq.num_tokens:
            raise ValueError(f"request {rid}: cannot cache {tokens.size} tokens, only {seq.num_tokens} computed")
        end = tokens.size - tokens.size % self.page_size
        if seq.slab is not None:
            slab_end = seq.cached_len + seq.slab_len
            if end < slab_end:
                return
            node = self.hot_slabs.cache_slab(seq, tokens[:slab_end])
            self._relock(seq, node, slab_end)
            seq.n_new -= seq.slab_len
            seq.slab, seq.slab_len = None, 0
        if end > seq.cached_len:
            if fixed:
                self._cache_private(seq, tokens[:end], fixed)
            else:  # (the two-argument call subclasses may override: the fuzzers' planted bugs)
                self._cache_private(seq, tokens[:end])

    def _cache_private(self, seq: _Seq, tokens: np.ndarray, fixed: bool = False) -> None:
        k = tokens.size - seq.cached_len
        own = seq.priv[:k]  # insert copies them; the locked path already holds tokens[:cached_len]
        node, already = self.radix.insert(tokens, own, self.store.name, below=seq.node, fixed=fixed, locking=True)
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

    def release(self, rid: int, tokens: np.ndarray | None = None, fixed: bool = False) -> None:
        """End a request. With ``tokens`` (finished), cache its computed tokens first;
        without (preempted / aborted), just free its private slots. ``fixed``: as for ``cache_prefix``."""
        seq = self.requests.get(rid)
        if seq._growth is not None:
            self.untrack(rid)
        if tokens is not None:
            tokens = np.asarray(tokens, TOKEN_DTYPE)[: seq.num_tokens]
            if seq.slab is not None and seq.n_new < seq.slab_len:
                tokens = tokens[: seq.cached_len]  # slab never filled: nothing new to cache
            self._cache(seq, tokens, fixed)  # (its prefix group goes with it)
        if seq.slab is not None:
            self.hot.release(seq.slab)
        if seq.priv.size:
            self.store.release(seq.priv)
        self.radix.unlock(seq.node)
        self.requests.remove(rid)

    # ---- eviction (Eviction) ---------------------------------------------------------------
    def evict(self, n: int) -> int:
        """Evict up to ``n`` cached private-pool tokens (LRU); returns tokens freed."""
        return self.eviction.evict(self.store.name, n)

    def clear_cache(self) -> int:
        """Evict every unlocked cached node in every pool; returns tokens freed."""
        return self.eviction.clear_cache()

    def give_back_hot(self) -> None:
        """Adaptive HOT: free HOT space goes back to COLD (no-op otherwise); HOT grows again on demand."""
        if self.hot_slabs is not None:
            self.hot_slabs.give_back_free()

    # ---- HOT slabs (HotSlabs; granikv only) -----------------------------------------------
    def compact(self) -> list[KVCopy]:
        """Compact the HOT pool now; the copies are also queued for the executor."""
        return self.hot_slabs.compact() if self.hot_slabs is not None else []

    def take_transfers(self) -> list[KVTransfer]:
        """Host-tier copies queued since the last call, in order (none without a tier)."""
        return self.host_tier.take() if self.host_tier is not None else []

    def take_copies(self) -> list[KVCopy]:
        """KV copies queued since the last call (the executor applies them before the step)."""
        return self.hot_slabs.take_copies() if self.hot_slabs is not None else []

    def rebalance(self) -> None:
        """Adaptive HOT: shrink HOT towards the current prefix demand (no-op otherwise)."""
        if self.hot_slabs is not None:
            self.hot_slabs.rebalance()

    def hot_demand(self) -> int:
        """Tokens of the distinct shared prefixes asked for in the last DEMAND_WINDOW admissions
        (adaptive HOT; 0 otherwise)."""
        demand = self.hot_slabs.demand if self.hot_slabs is not None else None
        return demand.total() if demand is not None else 0

    # ---- layouts and reports (AllocatorViews) ---------------------------------------------
    def layout(self, rid: int) -> RequestLayout:
        return self.views.layout(rid)

    def prefix_group(self, rid: int) -> tuple[int, int, str] | None:
        """(group node id, shared tokens, storage 'slab' | pool name) or None."""
        return self.views.prefix_group(rid)

    def num_tokens(self, rid: int) -> int:
        return self.views.num_tokens(rid)

    def live_requests(self) -> list[int]:
        return self.views.live_requests()

    def ownership(self) -> list[tuple[str, int, str, np.ndarray]]:
        """(owner kind 'request' | 'node', owner id, pool, slots) for every owned slot run."""
        return self.views.ownership()

    def pools(self) -> dict[str, object]:
        return self.views.pools()

    # ---- introspection for the fuzzer (granisim.kv.protocol) -------------------------------
    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """Slots of the longest cached prefix of ``tokens`` (a use, for LRU)."""
        return path_slots(self.radix.match_prefix(tokens).node)

    def cached_runs(self) -> list[CachedRun]:
        return self.views.cached_runs()

    def free_slots(self) -> dict[str, np.ndarray]:
        self.settle()
        return self.views.free_slots()

    def pool_bounds(self) -> dict[str, tuple[int, int]]:
        return self.views.pool_bounds()

    def occupancy(self) -> dict[str, tuple[int, int]]:
        """(used, cached) tokens per pool — the cheap part of :meth:`stats`, for per-step logs."""
        return self.views.occupancy()

    def step_row(self) -> tuple:
        """(hit rate, evictions, used and cached tokens of each pool in ``occupancy()`` order)."""
        return self.views.step_row()

    def stats(self) -> AllocatorStats:
        return self.views.stats()

    @property
    def hit_rate(self) -> float:
        return self.views.hit_rate()

    @property
    def evictions(self) -> int:
        return self.counters.evictions


def make_allocator(policy: str, capacity: int, *, hot_fraction: float | str = 0.2, page_size: int | None = None,
                   demand_window: int = DEMAND_WINDOW, host: HostTierConfig | None = None,
                   slot_ids: bool = True) -> KVAllocator:
    """``policy`` is ``granikv``, ``token``, ``paged`` or ``pagedN`` (e.g. ``paged16``).

    ``hot_fraction`` (``granikv`` only): a number sets the HOT/COLD split in
    :func:`build_pools`; ``"adaptive"`` gives :class:`granisim.kv.hot_slabs.HotSlabs` a
    :class:`granisim.kv.hot_demand.HotDemand` over ``demand_window`` admissions, and the
    boundary moves in ``HotSlabs.can_place`` (grow) and ``HotSlabs.rebalance`` (shrink).
    ``slot_ids=False`` (no host tier): COLD / token slots are counted, not named
    (:class:`granisim.kv.cold_pool.CountingColdPool`): the same decisions, for a caller that reads no
    COLD slot id."""
    if policy.startswith("paged") and policy != "paged":
        digits = policy[len("paged"):]
        if not digits.isdigit():
            raise ValueError(f"unknown allocator policy {policy!r}; use paged<N>, e.g. paged16")
        return KVAllocator("paged", capacity, page_size=int(digits), host=host)
    return KVAllocator(policy, capacity, hot_fraction=hot_fraction,
                       page_size=16 if page_size is None else page_size, demand_window=demand_window, host=host,
                       slot_ids=slot_ids)
