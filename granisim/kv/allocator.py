"""The allocator interface the scheduler uses, and its three policies.

Policies (one class, three configurations — see :func:`make_allocator`):

* ``granikv`` — HOT pool of contiguous slabs (``hot_fraction`` of the budget) for shared
  prefixes + COLD pool (page size 1) for everything else.
* ``token`` — page size 1 everywhere (SGLang's default).
* ``paged`` — pages of ``page_size`` everywhere (vLLM's default is 16); matching and
  caching are floored to whole pages.

HOT placement rule (``granikv``): a prefix goes to HOT when the workload *declares* it
shared (``shared_len`` at admission: the agent role's system prompt) and the part not
already cached needs a slab. When HOT has no free run long enough, the allocator
(1) compacts if total free space suffices, (2) else evicts unlocked HOT leaf slabs (HOT
nodes with no HOT node below them; their cached COLD descendants go with them) in LRU order
and compacts, (3) else falls back to COLD. Each outcome is
counted in stats (``hot_placements``, ``compactions``, ``hot_evictions``, ``hot_fallbacks``).
Compaction's KV copies are queued for the executor (:meth:`take_copies`).

Adaptive HOT (``hot_fraction="adaptive"``): the HOT/COLD boundary moves online with
demand instead of sitting at a fixed share (mechanics: :mod:`granisim.kv.elastic`; the
boundary only ever moves across free slots). HOT starts empty. When an admission wants a
slab that HOT cannot place, HOT first grows into the free run at COLD's low end — never
taking what COLD needs for the request and the scheduler's reserve, plus a 2% headroom.
:meth:`rebalance` (the scheduler calls it before each plan) shrinks HOT back towards the
demand — the total length of the distinct shared prefixes asked for in the last
``DEMAND_WINDOW`` admissions — evicting least-recently-used unlocked slabs beyond it and
handing HOT's free top run back to COLD.

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
from granisim.kv.hot_pool import HotPool, KVCopy
from granisim.kv.layout import AllocatorStats, KVSegment, PoolStats, RequestLayout
from granisim.kv.paged_pool import PagedPool
from granisim.kv.radix import TOKEN_DTYPE, RadixIndex, RadixNode, path_to
from granisim.kv.stores import PageStore, TokenStore

POLICIES = ("granikv", "token", "paged")
_EMPTY = np.empty(0, np.int64)
DEMAND_WINDOW = 256  # admissions over which a shared prefix counts as in demand (adaptive HOT)
HOT_HEADROOM = 0.02  # share of the budget COLD keeps free when HOT grows (adaptive HOT)


def _is_run(slots: np.ndarray) -> bool:
    """True when ``slots`` are consecutive ascending ids (first/last alone is not enough:
    HOT runs placed out of address order, e.g. [0, 2, 1, 3], span the right range)."""
    return bool(slots.size) and bool((np.diff(slots) == 1).all())


class OutOfKVMemory(RuntimeError):
    """Not enough free or evictable KV slots; the scheduler should have asked first."""


class _Seq:
    """A live request: tokens [0, cached_len) on a locked radix path, then an optional
    reserved HOT slab of slab_len tokens (filled first), then private slots priv[:n_priv]."""

    __slots__ = ("rid", "node", "cached_len", "shared_len", "slab", "slab_len", "n_new", "group", "_buf", "_lo",
                 "_hi")

    def __init__(self, rid: int, node: RadixNode, cached_len: int, shared_len: int):
        self.rid = rid
        self.node = node
        self.cached_len = cached_len
        self.shared_len = shared_len
        self.slab: int | None = None
        self.slab_len = 0
        self.n_new = 0  # tokens allocated beyond cached_len
        self.group: tuple[int, int, str] | None = None  # (node id, shared tokens, storage)
        # reserved private slots (paged: whole pages) are _buf[_lo:_hi]; the buffer grows by
        # doubling so that a decode step's append is O(1) amortised
        self._buf = _EMPTY
        self._lo = self._hi = 0

    @property
    def priv(self) -> np.ndarray:
        return self._buf[self._lo : self._hi]

    def push(self, slots: np.ndarray) -> None:
        n = slots.size
        if self._hi + n > self._buf.size:
            live = self._hi - self._lo
            buf = np.empty(max(16, 2 * (live + n)), np.int64)
            buf[:live] = self._buf[self._lo : self._hi]
            self._buf, self._lo, self._hi = buf, 0, live
        self._buf[self._hi : self._hi + n] = slots
        self._hi += n

    def drop_front(self, k: int) -> None:
        self._lo += k

    @property
    def n_priv(self) -> int:
        return max(0, self.n_new - self.slab_len)

    @property
    def num_tokens(self) -> int:
        return self.cached_len + self.n_new


class KVAllocator:
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

    def _wants_slab(self, shared_len: int, matched: int, prompt_len: int) -> bool:
        return self.hot is not None and (self.hot.capacity > 0 or self.adaptive) and matched < shared_len <= prompt_len

    # ---- adaptive HOT boundary ------------------------------------------------------------
    def _note_demand(self, tokens: np.ndarray, shared_len: int) -> None:
        self._demand[hash(tokens[:shared_len].tobytes())] = (shared_len, self._admissions)

    def hot_demand(self) -> int:
        """Tokens of the distinct shared prefixes asked for in the last DEMAND_WINDOW admissions."""
        horizon = self._admissions - self._demand_window
        stale = [k for k, (_, t) in self._demand.items() if t < horizon]
        for k in stale:
            del self._demand[k]
        return sum(n for n, _ in self._demand.values())

    def _grow_hot(self, n: int, cold_need: int, m) -> None:
        """Grow HOT so that a slab of ``n`` fits, out of COLD's free low run, leaving COLD
        what the request (``cold_need`` tokens incl. the scheduler's reserve) and the headroom need."""
        hot, pool = self.hot, self.store.pool
        if hot.largest_free >= n:
            return
        on_path = sum(len(x) for x in m.path() if x.lock_ref == 0 and x.pool == self.store.name)
        spare = pool.free + self.radix.evictable.get(self.store.name, 0) - on_path - max(0, cold_need) \
            - int(HOT_HEADROOM * self.capacity)
        want = n - hot.top_free_run()
        if want <= 0 or spare < want:
            return
        run = pool.low_free_run()
        if run < want and self._drained_at != self._admissions:
            pool.prefer_high()  # let the low end drain as requests finish
            self._drained_at = self._admissions
        if run >= want:
            pool.give_low(want)
            hot.grow_top(want)

    def rebalance(self) -> None:
        """Adaptive HOT: shrink HOT towards the current prefix demand (no-op otherwise)."""
        if not self.adaptive:
            return
        hot, target = self.hot, self.hot_demand()
        if hot.capacity - target < self._hyst:
            return
        while hot.capacity - hot.free > target:  # stale slabs beyond the demand, LRU first
            victims = self._hot_leaves()
            if not victims:
                break
            self.radix.evict_subtree(min(victims, key=lambda x: (x.last_access, x.id)), self._free_node)
            self._n["hot_evictions"] += 1
        give = min(hot.capacity - target, hot.free)
        if hot.top_free_run() < give and give - hot.top_free_run() >= self._hyst:
            self.compact()
        give = min(give, hot.top_free_run())
        if give >= self._hyst:
            hot.shrink_top(give)
            self.store.pool.take_low(give)

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

    def _cache_slab(self, seq: _Seq, tokens: np.ndarray) -> None:
        start, _ = self.hot.span(seq.slab)
        slots = np.concatenate([self._path_slots(seq.node), np.arange(start, start + seq.slab_len)])
        node, already = self.radix.insert(tokens, slots, "hot")
        dup = already - seq.cached_len
        slab = seq.slab
        del self._slab_owner[slab]
        if dup >= seq.slab_len:
            self.hot.release(slab)
        else:
            if dup > 0:
                tail = self.hot.split(slab, dup)
                self.hot.release(slab)
                slab = tail
            node.slab = slab
            self._slab_owner[slab] = node
        self._relock(seq, node, tokens.size)
        seq.n_new -= seq.slab_len
        seq.slab, seq.slab_len = None, 0

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

    # ---- layouts --------------------------------------------------------------------------
    def layout(self, rid: int) -> RequestLayout:
        seq = self._seq(rid)
        segs: list[KVSegment] = []
        for node in path_to(seq.node):
            self._append(segs, node.pool, node.value)
        if seq.slab is not None and seq.n_new:
            s0, _ = self.hot.span(seq.slab)
            filled = min(seq.n_new, seq.slab_len)
            self._append(segs, "hot", np.arange(s0, s0 + filled, dtype=np.int64))
        if seq.n_priv:
            self._append(segs, self.store.name, seq.priv[: seq.n_priv])
        group, shared = (seq.group[0], seq.group[1]) if seq.group else (None, 0)
        return RequestLayout(rid, tuple(segs), seq.num_tokens, shared, group)

    @staticmethod
    def _append(segs: list[KVSegment], pool: str, slots: np.ndarray) -> None:
        if segs and segs[-1].pool == pool:
            slots = np.concatenate([segs[-1].slots, slots])
            segs.pop()
        contiguous = pool == "hot" and _is_run(slots)
        segs.append(KVSegment(pool, slots, (int(slots[0]), int(slots.size)) if contiguous else None))

    def prefix_group(self, rid: int) -> tuple[int, int, str] | None:
        """(group node id, shared tokens, storage 'slab' | pool name) or None."""
        return self._seq(rid).group

    def num_tokens(self, rid: int) -> int:
        return self._seq(rid).num_tokens

    def _update_group(self, seq: _Seq) -> None:
        shared = seq.shared_len - seq.shared_len % self.page_size
        seq.group = None
        if shared <= 0 or seq.cached_len < shared:
            return
        depth, path = 0, []
        for node in path_to(seq.node):
            depth += len(node)
            path.append(node)
            if depth >= shared:
                break
        if depth != shared:
            return
        slots = np.concatenate([n.value for n in path])
        slab = all(n.pool == "hot" for n in path) and _is_run(slots)
        seq.group = (path[-1].id, shared, "slab" if slab else path[-1].pool)

    # ---- memory pressure ------------------------------------------------------------------
    def _free_node(self, node: RadixNode) -> None:
        if node.pool == "hot":
            del self._slab_owner[node.slab]
            self.hot.release(node.slab)
        else:
            self.store.release(node.value)
        self._n["evictions"] += 1
        self._n["evicted_tokens"] += len(node)

    def _evict(self, pool: str, n: int) -> int:
        return self.radix.evict(n, pool, self._free_node)

    def evict(self, n: int) -> int:
        """Evict up to ``n`` cached private-pool tokens (LRU); returns tokens freed."""
        return self._evict(self.store.name, n)

    def clear_cache(self) -> int:
        """Evict every unlocked cached node in every pool; returns tokens freed."""
        freed = 0
        for node in list(self.radix.root.children.values()):
            freed += self._evict_unlocked(node)
        return freed

    def _evict_unlocked(self, node: RadixNode) -> int:
        if node.lock_ref == 0:
            return self.radix.evict_subtree(node, self._free_node)
        return sum(self._evict_unlocked(c) for c in list(node.children.values()))

    def _make_hot_room(self, n: int) -> bool:
        hot = self.hot
        if n > hot.capacity:
            return False
        if hot.largest_free >= n:
            return True
        if hot.free + self.radix.evictable.get("hot", 0) < n:
            return False
        while hot.free < n:
            victims = self._hot_leaves()
            if not victims:
                return False
            victim = min(victims, key=lambda x: (x.last_access, x.id))
            self.radix.evict_subtree(victim, self._free_node)
            self._n["hot_evictions"] += 1
        if hot.largest_free < n:
            self.compact()
        return hot.largest_free >= n

    def _hot_leaves(self) -> list[RadixNode]:
        """Unlocked HOT nodes with no HOT node below them (LRU candidates: evicting one frees
        its slab and only its cold descendants, never a more recent HOT child's slab)."""
        hot_nodes = [x for x in self.radix.nodes() if x.pool == "hot"]
        above: set[int] = set()  # ids of nodes that have a HOT descendant
        for x in hot_nodes:
            p = x.parent
            while p is not None and p.id not in above:
                above.add(p.id)
                p = p.parent
        return [x for x in hot_nodes if x.lock_ref == 0 and x.id not in above]

    def compact(self) -> list[KVCopy]:
        """Compact the HOT pool now; the copies are also queued for the executor."""
        if self.hot is None:
            return []
        copies = self.hot.compact()
        for slab, owner in self._slab_owner.items():
            if isinstance(owner, RadixNode):
                start, length = self.hot.span(slab)
                owner.value = np.arange(start, start + length, dtype=np.int64)
        self._copies.extend(copies)
        return copies

    def take_copies(self) -> list[KVCopy]:
        """KV copies queued since the last call (the executor applies them before the step)."""
        out, self._copies = self._copies, []
        return out

    def _on_split(self, head: RadixNode, tail: RadixNode) -> None:
        if tail.pool == "hot":
            head.slab = tail.slab
            tail.slab = self.hot.split(tail.slab, len(head))
            self._slab_owner[head.slab] = head
            self._slab_owner[tail.slab] = tail

    # ---- introspection --------------------------------------------------------------------
    def _seq(self, rid: int) -> _Seq:
        try:
            return self._seqs[rid]
        except KeyError:
            raise ValueError(f"unknown request id {rid!r} (never admitted or already released)") from None

    @staticmethod
    def _path_slots(node: RadixNode) -> np.ndarray:
        vals = [n.value for n in path_to(node)]
        return np.concatenate(vals) if vals else _EMPTY

    def live_requests(self) -> list[int]:
        return list(self._seqs)

    def ownership(self) -> list[tuple[str, int, str, np.ndarray]]:
        """(owner kind 'request' | 'node', owner id, pool, slots) for every owned slot run."""
        out = []
        for seq in self._seqs.values():
            if seq.slab is not None:
                s0, ln = self.hot.span(seq.slab)
                out.append(("request", seq.rid, "hot", np.arange(s0, s0 + ln, dtype=np.int64)))
            if seq.priv.size:
                out.append(("request", seq.rid, self.store.name, seq.priv))
        for node in self.radix.nodes():
            out.append(("node", node.id, node.pool, node.value))
        return out

    def pools(self) -> dict[str, object]:
        out = {self.store.name: self.store}
        if self.hot is not None:
            out["hot"] = self.hot
        return out

    def occupancy(self) -> dict[str, tuple[int, int]]:
        """(used, cached) tokens per pool — the cheap part of :meth:`stats`, for per-step logs."""
        out = {}
        for name, pool in self.pools().items():
            cached = self.radix.evictable.get(name, 0)
            out[name] = (pool.capacity - pool.free - cached, cached)
        return out

    @property
    def hit_rate(self) -> float:
        n = self._n
        return n["hit_tokens"] / n["lookup_tokens"] if n["lookup_tokens"] else 0.0

    @property
    def evictions(self) -> int:
        return self._n["evictions"]

    def stats(self) -> AllocatorStats:
        pools, objs = {}, self.pools()
        for name, (used, cached) in self.occupancy().items():
            pool = objs[name]
            free = pool.free
            if name == "hot":
                frag = pool.external_fragmentation()
            elif self.page_size > 1:
                spare = sum(s.priv.size - s.n_priv for s in self._seqs.values())
                frag = spare / used if used else 0.0
            else:
                frag = 0.0
            pools[name] = PoolStats(pool.capacity, free, used, cached, frag)
        hot = self.hot
        return AllocatorStats(
            policy=self.policy, pools=pools,
            compactions=hot.compactions if hot else 0, copied_tokens=hot.copied_tokens if hot else 0,
            **self._n,
        )


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
