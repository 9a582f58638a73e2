"""A deliberately simple reference model of the three allocator policies, for the fuzzer.

The fuzzer runs it in lockstep with the real allocator and compares every answer: admit
yes/no, matched lengths, whether an extend fits, tokens freed by eviction, the event
counters, per-pool free/used/cached counts, how many slots each request holds and the
whole shape of the prefix tree (which runs are cached, in which pool, locked or not).

It counts tokens, never slot ids: the cache is a tree of plain records whose runs are
token tuples, pools are free counters, a request is a dict. Eviction picks the least
recently used unlocked leaf by a logical clock that ticks where the real index ticks
(every lookup, insert and unlock). Where the real allocator decides by slot layout (the
adaptive HOT/COLD boundary follows the free runs next to it), the model takes the
boundary move it observes and checks it against the rules instead (only grows into
spare COLD room beyond the headroom, only shrinks towards demand by at least the
hysteresis).
"""

from __future__ import annotations

HOT_HEADROOM = 0.02  # kept in step with granisim.kv.hot_slabs (the spec, not an import)


def _ints(tokens) -> tuple[int, ...]:
    """``tokens`` (a numpy array, or a sequence of ints) as a tuple of Python ints."""
    return tuple(tokens.tolist()) if hasattr(tokens, "tolist") else tuple(map(int, tokens))


class _Run:
    __slots__ = ("id", "parent", "tokens", "pool", "lock", "stamp", "children")

    def __init__(self, rid, parent, tokens, pool):
        self.id, self.parent, self.tokens, self.pool = rid, parent, tokens, pool
        self.lock, self.stamp, self.children = 0, 0, {}


class ModelMismatch(AssertionError):
    """The real allocator answered differently from the reference model."""


class ReferenceModel:
    def __init__(self, policy: str, capacity: int, *, page_size: int = 1, hot_fraction: float | str = 0.0,
                 demand_window: int = 256):
        self.page = page_size if policy == "paged" else 1
        self.has_hot = policy == "granikv"
        self.adaptive = self.has_hot and hot_fraction == "adaptive"
        self.store = {"granikv": "cold", "token": "token", "paged": "paged"}[policy]
        hot = 0 if not self.has_hot or self.adaptive else int(capacity * hot_fraction)
        store_cap = capacity - hot if policy != "paged" else capacity // self.page * self.page
        self.cap = {self.store: store_cap}
        if self.has_hot:
            self.cap["hot"] = hot
        self.free = dict(self.cap)
        self.root = _Run(0, None, (), "root")
        self.root.lock = 1
        self._cache = None  # (shape, evictable per pool) of the tree as it is; None after any change
        self.next_id, self.clock = 1, 0
        self.reqs: dict[int, dict] = {}
        self.counters = dict(lookups=0, hit_tokens=0, lookup_tokens=0, evictions=0, evicted_tokens=0,
                             hot_placements=0, hot_fallbacks=0, hot_evictions=0)
        self.window, self.asked, self.admissions = demand_window, {}, 0
        self.budget, self.hysteresis = capacity, max(1, capacity // 64)

    # ---- the prefix tree ------------------------------------------------------------------
    def runs(self) -> list[_Run]:
        """Every cached run (in no particular order: callers pick by key or sum)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            if n.children:
                stack.extend(n.children.values())
        return out

    def shape(self) -> set[tuple[tuple[int, ...], str, bool]]:
        """(whole token path to the run's end, pool, locked) of every cached run."""
        return self._summary()[0]

    def _summary(self):
        """(:meth:`shape`, :meth:`evictable` per pool), computed once per state of the tree."""
        if self._cache is None:
            out, evictable = set(), dict.fromkeys(self.cap, 0)
            stack = [(c, ()) for c in self.root.children.values()]
            while stack:
                n, above = stack.pop()
                path = above + n.tokens
                out.add((path, n.pool, n.lock > 0))
                if n.lock == 0:
                    evictable[n.pool] = evictable.get(n.pool, 0) + len(n.tokens)
                if n.children:
                    stack.extend((c, path) for c in n.children.values())
            self._cache = (out, evictable)
        return self._cache

    def _key(self, tokens):
        return tuple(tokens[: self.page])

    def _split(self, child: _Run, m: int) -> _Run:
        self._cache = None
        parent = child.parent
        head = _Run(self.next_id, parent, child.tokens[:m], child.pool)
        self.next_id += 1
        head.lock, head.stamp = child.lock, child.stamp
        child.tokens, child.parent = child.tokens[m:], head
        head.children[self._key(child.tokens)] = child
        parent.children[self._key(head.tokens)] = head
        return head

    def match(self, tokens, max_len: int | None = None) -> tuple[_Run, int]:
        tokens = _ints(tokens[: max(0, max_len)] if max_len is not None else tokens)
        self.clock += 1
        node, pos = self.root, 0
        while pos + self.page <= len(tokens):
            child = node.children.get(self._key(tokens[pos:]))
            if child is None:
                break
            m = 0
            while m < min(len(child.tokens), len(tokens) - pos) and child.tokens[m] == tokens[pos + m]:
                m += 1
            m -= m % self.page
            if m == 0:
                break
            if m < len(child.tokens):
                child = self._split(child, m)
                child.stamp = self.clock
                return child, pos + m
            child.stamp = self.clock
            node, pos = child, pos + m
        return node, pos

    def _insert(self, tokens, pool: str) -> tuple[_Run, int]:
        tokens = _ints(tokens)
        node, pos = self.match(tokens)
        if pos < len(tokens):
            self._cache = None
            leaf = _Run(self.next_id, node, tokens[pos:], pool)
            self.next_id += 1
            self.clock += 1
            leaf.stamp = self.clock
            node.children[self._key(leaf.tokens)] = leaf
            node = leaf
        return node, pos

    def _path(self, node: _Run) -> list[_Run]:
        out = []
        while node is not self.root:
            out.append(node)
            node = node.parent
        return out

    def _lock(self, node):
        self._cache = None
        for x in self._path(node):
            x.lock += 1

    def _unlock(self, node):
        self._cache = None
        self.clock += 1
        for x in self._path(node):
            x.lock -= 1
            x.stamp = self.clock

    def evictable(self, pool: str) -> int:
        return self._summary()[1].get(pool, 0)

    def _drop(self, node: _Run) -> int:
        """Remove an unlocked run with its subtree; returns tokens freed."""
        self._cache = None
        freed = sum(self._drop(c) for c in list(node.children.values()))
        del node.parent.children[self._key(node.tokens)]
        self.free[node.pool] += len(node.tokens)
        self.counters["evictions"] += 1
        self.counters["evicted_tokens"] += len(node.tokens)
        return freed + len(node.tokens)

    def _evict(self, pool: str, n: int) -> int:
        """LRU leaves of ``pool`` first; when none is left, the LRU unlocked run of ``pool`` that
        only descendants in another pool (a HOT slab below a COLD prefix) keep from being a leaf,
        with its subtree: every cached token of a pool is obtainable by evicting in that pool."""
        freed = 0
        while freed < n:
            leaves = [x for x in self.runs() if not x.children and x.lock == 0 and x.pool == pool]
            if leaves:
                freed += self._drop(min(leaves, key=lambda x: (x.stamp, x.id)))
                continue
            rest = [x for x in self.runs() if x.lock == 0 and x.pool == pool]
            if not rest:
                break
            before = self.evictable(pool)
            self._drop(min(rest, key=lambda x: (x.stamp, x.id)))
            freed += before - self.evictable(pool)
        return freed

    def _evict_hot_leaf(self) -> bool:
        hot = [x for x in self.runs() if x.pool == "hot"]
        above = {id(p) for x in hot for p in self._path(x.parent)}
        victims = [x for x in hot if x.lock == 0 and id(x) not in above]
        if not victims:
            return False
        self._drop(min(victims, key=lambda x: (x.stamp, x.id)))
        self.counters["hot_evictions"] += 1
        return True

    # ---- pools ----------------------------------------------------------------------------
    def need(self, spare: int, n: int) -> int:
        extra = max(0, n - spare)
        return -(-extra // self.page) * self.page

    def move_boundary(self, delta: int) -> None:
        """HOT grows by ``delta`` slots (shrinks if negative), taken from / given to COLD's free."""
        if not delta:
            return
        if not self.adaptive:
            raise ModelMismatch(f"the HOT/COLD boundary moved by {delta} with a fixed hot_fraction")
        self.cap["hot"] += delta
        self.free["hot"] += delta
        self.cap[self.store] -= delta
        self.free[self.store] -= delta
        if min(self.free.values()) < 0:
            raise ModelMismatch(f"the HOT/COLD boundary moved by {delta} across slots that were not free")

    def _wants_slab(self, shared: int, matched: int, length: int) -> bool:
        return self.has_hot and (self.cap["hot"] > 0 or self.adaptive) and matched < shared <= length

    def _note(self, tokens, shared: int) -> None:
        if self.adaptive and shared:
            self.asked[_ints(tokens[:shared])] = (shared, self.admissions)

    def demand(self) -> int:
        horizon = self.admissions - self.window
        self.asked = {k: v for k, v in self.asked.items() if v[1] >= horizon}
        return sum(n for n, _ in self.asked.values())

    # ---- the scheduler's questions --------------------------------------------------------
    def can_admit(self, tokens, shared: int, reserve: int, hot_delta: int = 0) -> bool:
        node, m = self.match(tokens, len(tokens) - 1)
        need = len(tokens) - m + reserve
        self._note(tokens, shared)
        if self._wants_slab(shared, m, len(tokens)):
            n = shared - m
            if hot_delta < 0:
                raise ModelMismatch(f"can_admit shrank HOT by {-hot_delta}")
            self.move_boundary(hot_delta)
            on_path = sum(len(x.tokens) for x in self._path(node) if x.lock == 0 and x.pool == self.store)
            spare = self.free[self.store] + self.evictable(self.store) - on_path - max(0, need - n)
            if hot_delta and spare < int(HOT_HEADROOM * self.budget):
                raise ModelMismatch(f"HOT grew by {hot_delta} into the COLD headroom ({spare} spare left)")
            hot_path = sum(len(x.tokens) for x in self._path(node) if x.lock == 0 and x.pool == "hot")
            if self.free["hot"] + self.evictable("hot") - hot_path >= n:  # its own path is locked at admit
                need -= n
        elif hot_delta:
            raise ModelMismatch(f"can_admit moved the HOT/COLD boundary by {hot_delta} without wanting a slab")
        on_path = sum(len(x.tokens) for x in self._path(node) if x.lock == 0 and x.pool == self.store)
        return self.need(0, need) <= self.free[self.store] + self.evictable(self.store) - on_path

    def admit(self, rid: int, tokens, shared: int) -> int:
        node, m = self.match(tokens, len(tokens) - 1)
        if self.adaptive and shared:
            self._note(tokens, shared)
            self.admissions += 1
        self._lock(node)
        c = self.counters
        c["lookups"] += 1
        c["hit_tokens"] += m
        c["lookup_tokens"] += len(tokens)
        r = self.reqs[rid] = dict(node=node, cached=m, slab=0, n_new=0, reserved=0)
        if self._wants_slab(shared, m, len(tokens)):
            n = shared - m
            if self._make_room(n):
                r["slab"] = n
                self.free["hot"] -= n
                c["hot_placements"] += 1
            else:
                c["hot_fallbacks"] += 1
        return m

    def _make_room(self, n: int) -> bool:
        if n > self.cap["hot"]:
            return False
        if self.free["hot"] >= n:
            return True
        if self.free["hot"] + self.evictable("hot") < n:
            return False
        while self.free["hot"] < n:
            if not self._evict_hot_leaf():
                return False
        return True

    def extend_need(self, rid: int, n: int) -> int:
        r = self.reqs[rid]
        from_slab = min(n, r["slab"] - min(r["n_new"], r["slab"]))
        n_priv = max(0, r["n_new"] - r["slab"])
        return self.need(r["reserved"] - n_priv, n - from_slab)

    def can_extend(self, demands: dict[int, int]) -> bool:
        total = sum(self.extend_need(r, n) for r, n in demands.items())
        return total <= self.free[self.store] + self.evictable(self.store)

    def extend(self, rid: int, n: int) -> bool:
        need = self.extend_need(rid, n)
        if need > self.free[self.store]:
            self._evict(self.store, need - self.free[self.store])
            if need > self.free[self.store]:
                return False
        self.free[self.store] -= need
        self.reqs[rid]["reserved"] += need
        self.reqs[rid]["n_new"] += n
        return True

    def num_tokens(self, rid: int) -> int:
        return self.reqs[rid]["cached"] + self.reqs[rid]["n_new"]

    def cache_prefix(self, rid: int, tokens) -> None:
        r = self.reqs[rid]
        end = len(tokens) - len(tokens) % self.page
        if r["slab"]:
            slab_end = r["cached"] + r["slab"]
            if end < slab_end:
                return
            node, already = self._insert(tokens[:slab_end], "hot")
            self.free["hot"] += min(r["slab"], max(0, already - r["cached"]))
            self._relock(r, node, slab_end)
            r["n_new"] -= r["slab"]
            r["slab"] = 0
        if end > r["cached"]:
            k = end - r["cached"]
            node, already = self._insert(tokens[:end], self.store)
            self.free[self.store] += max(0, already - r["cached"])
            self._relock(r, node, end)
            r["reserved"] -= k
            r["n_new"] -= k

    def _relock(self, r: dict, node: _Run, cached: int) -> None:
        self._lock(node)
        self._unlock(r["node"])
        r["node"], r["cached"] = node, cached

    def release(self, rid: int, tokens=None) -> None:
        r = self.reqs[rid]
        if tokens is not None:
            tokens = tokens[: self.num_tokens(rid)]
            if r["slab"] and r["n_new"] < r["slab"]:
                tokens = tokens[: r["cached"]]
            self.cache_prefix(rid, tokens)
        if r["slab"]:
            self.free["hot"] += r["slab"]
        self.free[self.store] += r["reserved"]
        self._unlock(r["node"])
        del self.reqs[rid]

    def evict(self, n: int) -> int:
        return self._evict(self.store, n)

    def clear_cache(self) -> int:
        freed = 0
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            if x.lock == 0:
                freed += self._drop(x)
            else:
                stack.extend(x.children.values())
        return freed

    def rebalance(self, hot_delta: int) -> None:
        if not self.adaptive:
            return self.move_boundary(hot_delta)
        target = self.demand()
        if self.cap["hot"] - target < self.hysteresis:
            if hot_delta:
                raise ModelMismatch(f"rebalance moved the boundary by {hot_delta} though HOT is within "
                                    f"{self.hysteresis} slots of the demand {target}")
            return
        while self.cap["hot"] - self.free["hot"] > target:
            if not self._evict_hot_leaf():
                break
        limit = min(self.cap["hot"] - target, self.free["hot"])
        if hot_delta > 0 or -hot_delta > limit or 0 < -hot_delta < self.hysteresis:
            raise ModelMismatch(f"rebalance moved the boundary by {hot_delta}: expected a shrink of 0 or "
                                f"{self.hysteresis}..{limit} slots (demand {target})")
        self.move_boundary(hot_delta)

    # ---- what is compared -----------------------------------------------------------------
    def pool_counts(self) -> dict[str, tuple[int, int, int, int]]:
        """(capacity, free, used, cached) per pool."""
        out, evictable = {}, self._summary()[1]
        for name, cap in self.cap.items():
            cached = evictable[name]
            out[name] = (cap, self.free[name], cap - self.free[name] - cached, cached)
        return out

    def held(self, rid: int) -> dict[str, int]:
        """Slots request ``rid`` holds per pool (its slab, its reserved private slots)."""
        r = self.reqs[rid]
        out = {self.store: r["reserved"]}
        if self.has_hot:
            out["hot"] = r["slab"]
        return out
