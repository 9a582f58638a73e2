"""Property-based fuzzing of an allocator with hypothesis stateful testing.

``allocator_machine(factory, model)`` builds a ``RuleBasedStateMachine`` for any allocator
that implements :class:`granisim.kv.protocol.AllocatorProtocol` (the machine reads nothing
else), so users can point it at their own policy (``docs/fuzzing.md``). With ``model`` (a
factory of :class:`granisim.experiments.fuzz_model.ReferenceModel`, for our three policies)
every answer is also compared with a simple reference model run in lockstep.

Rules drive the allocator the way the scheduler does: admission (``can_admit`` then
``admit``, with prompt lengths drawn at the edges of the free space, of pages and of the
HOT pool), chunked prefill that can be preempted after any chunk, single and batched
decode (``can_extend_all`` / ``extend_all``), finish with or without caching, lookups,
eviction, flushing, compaction and the adaptive boundary's ``rebalance``. A shadow array
records the token last written into every slot (KV writes and compaction copies are
replayed on it), so a layout or cached run that maps to the wrong slots shows up.

Checked after every rule:
  * promises: after ``can_admit`` says yes, extending by the whole uncached prompt (plus the
    reserve) fits; after ``can_extend`` / ``can_extend_all`` says yes, the extend succeeds
    and returns exactly the slots asked for; ``can_extend_all`` agrees with ``can_extend``;
  * slots: every pool's free slots and owned slots exactly tile its range (no slot owned
    twice, none both owned and free, none lost); pools are disjoint inside ``[0, capacity)``;
    a pool boundary moves only across slots that were free on both sides;
  * counts: free + used + cached == capacity; used + cached == owned; cached == the unlocked
    cached runs; locks reach the root;
  * HOT runs are contiguous; a request holds fewer than one page of reserved, unwritten
    private slots (tightness);
  * every live request's layout, and every cached run, maps to exactly its own tokens;
  * with a model: admit yes/no, matched lengths, extend yes/no, tokens evicted, the event
    counters, per-pool counts, each request's slots per pool and the whole prefix tree
    (every cached run's token path, pool and lock state) equal the model's;
  * at teardown, after releasing everything and clearing the cache, every pool is free.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from granisim.experiments.fuzz_model import ModelMismatch, ReferenceModel
from granisim.kv.allocator import make_allocator
from granisim.kv.protocol import AllocatorProtocol

VOCAB = 6  # tiny vocabulary: many partial matches, hence many node splits
_rng = np.random.default_rng(5)
AGENT_PREFIXES = [_rng.integers(0, VOCAB, 56).astype(np.int64) for _ in range(3)]
FUZZ_CAPACITY = 160
FUZZ_HOT_FRACTION = 0.25
FUZZ_PAGE = 4
POLICIES = ("granikv", "granikv-adaptive", "token", "paged")


def _config(policy: str) -> tuple[str, dict]:
    if policy == "granikv-adaptive":  # a short demand window so that HOT also shrinks within one example
        return "granikv", dict(hot_fraction="adaptive", demand_window=1)
    if policy == "granikv":
        return "granikv", dict(hot_fraction=FUZZ_HOT_FRACTION)
    if policy == "paged":
        return "paged", dict(page_size=FUZZ_PAGE)
    if policy == "token":
        return "token", {}
    raise ValueError(f"unknown fuzz policy {policy!r}; choose one of {', '.join(POLICIES)}")


def default_factory(policy: str) -> Callable[[], AllocatorProtocol]:
    """The allocator each fuzz policy name stands for (160 slots)."""
    name, kw = _config(policy)
    return lambda: make_allocator(name, FUZZ_CAPACITY, **kw)


def default_model(policy: str) -> Callable[[], ReferenceModel]:
    """The reference model matching :func:`default_factory`."""
    name, kw = _config(policy)
    return lambda: ReferenceModel(name, FUZZ_CAPACITY, **kw)


class PromiseBroken(AssertionError):
    """The allocator said yes to a question and then could not deliver."""


def _agree(what: str, real, model) -> None:
    if real != model:
        raise ModelMismatch(f"{what}: allocator {real!r}, reference model {model!r}")


def allocator_machine(factory: Callable[[], AllocatorProtocol],
                      model: Callable[[], ReferenceModel] | None = None) -> type[RuleBasedStateMachine]:
    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.alloc = factory()
            self.model = model() if model is not None else None
            self.shadow = np.full(self.alloc.capacity, -1, dtype=np.int64)
            self.reqs: dict[int, dict] = {}  # rid -> tokens, prompt, shared, done
            self.history: list[np.ndarray] = []
            self.next_rid = 0
            self.bounds = self.alloc.pool_bounds()

        # ---- helpers ---------------------------------------------------------------------
        def _sync_copies(self):
            for c in self.alloc.take_copies():
                self.shadow[c.dst : c.dst + c.length] = self.shadow[c.src : c.src + c.length].copy()

        def _hot_delta(self) -> int:
            if self.model is None or "hot" not in self.model.cap:
                return 0
            lo, hi = self.alloc.pool_bounds().get("hot", (0, 0))
            return (hi - lo) - self.model.cap["hot"]

        def _pick(self, pick: int, pred) -> int | None:
            rids = sorted(r for r, q in self.reqs.items() if pred(q))
            return rids[pick % len(rids)] if rids else None

        def _extend(self, rid: int, n: int, promised: str) -> None:
            try:
                slots = self.alloc.extend(rid, n)
            except Exception as err:
                raise PromiseBroken(f"{promised} said yes, then extend({rid}, {n}) raised {err!r}") from err
            self._written(rid, n, slots)
            if self.model is not None and not self.model.extend(rid, n):
                raise ModelMismatch(f"extend({rid}, {n}) succeeded; the reference model has no room")

        def _written(self, rid: int, n: int, slots: np.ndarray) -> None:
            slots = np.asarray(slots)
            if slots.size != n:
                raise PromiseBroken(f"extend({rid}, {n}) returned {slots.size} slots")
            self._sync_copies()
            r = self.reqs[rid]
            self.shadow[slots] = r["tokens"][r["done"] : r["done"] + n]
            r["done"] += n

        def _release(self, rid: int, tokens) -> None:
            self.reqs.pop(rid)
            self.alloc.release(rid, tokens)
            self._sync_copies()
            if self.model is not None:
                self.model.release(rid, tokens)

        def _edges(self) -> list[int]:
            """Lengths at the edges of the free space, of pages and of HOT: where off-by-ones live."""
            page = self.alloc.page_size
            out = [1, 2, page - 1, page, page + 1, 2 * page, 2 * page + 1]
            for ps in self.alloc.stats().pools.values():
                for base in (ps.free, ps.free + ps.cached, ps.capacity):
                    out += [base - 1, base, base + 1]
            for free in self.alloc.free_slots().values():  # each run of consecutive free slots: exact fits
                if free.size:
                    f = np.sort(free)
                    cuts = np.flatnonzero(np.diff(f) != 1) + 1
                    for run in set(np.diff(np.concatenate([[0], cuts, [f.size]])).tolist()):
                        out += [run - 1, run, run + 1]
            for r in self.reqs.values():  # a request's room left in its last page
                out.append(-r["done"] % page + 1)
            return [x for x in out if x >= 1]

        # ---- rules -----------------------------------------------------------------------
        @rule(source=st.integers(-3, 2), reuse=st.integers(0, 10**6),
              length=st.one_of(st.integers(1, 48), st.integers(-10**6, -1)),
              shared=st.one_of(st.integers(0, 48), st.integers(-10**6, -1)),
              fill=st.integers(0, 2**16), outputs=st.integers(1, 8), reserve=st.sampled_from([0, 0, 1, 4]),
              now=st.sampled_from([0, 0, 1, 7, 64]))
        def admit(self, source, reuse, length, shared, fill, outputs, reserve, now):
            """A prompt (``fill`` seeds its own tokens, 0 = all zeros) of ``length`` tokens, or an edge
            length when negative; then ``outputs`` tokens to decode. With ``now`` > 0 the prefill runs
            at once in chunks of ``now`` (else later, chunk by chunk, in ``prefill``)."""
            edges = self._edges()
            fill = _tokens(fill, 64)
            if length < 0:  # negative draws pick a boundary length
                length = edges[-length % len(edges)]
            if shared < 0:
                shared = edges[-shared % len(edges)]
            if source >= 0:  # an agent role's prompt: its shared system prompt, then its own text
                prefix = AGENT_PREFIXES[source][:shared]
            elif source == -1 and self.history:  # a prefix of an earlier prompt
                prev = self.history[reuse % len(self.history)]
                prefix, shared = prev[: 1 + reuse % prev.size], 0
            else:
                prefix, shared = np.empty(0, np.int64), 0
            body = np.concatenate([prefix, fill])
            if body.size < length:
                body = np.concatenate([body, np.zeros(length - body.size, np.int64)])
            prompt = body[: max(length, prefix.size)] if source >= 0 else body[:length]
            shared = min(shared, prompt.size)
            yes = self.alloc.can_admit(prompt, shared, reserve)
            if self.model is not None:
                _agree(f"can_admit(len {prompt.size}, shared {shared}, reserve {reserve})", yes,
                       self.model.can_admit(prompt, shared, reserve, self._hot_delta()))
            self._sync_copies()
            self._boundary_moves_over_free()
            if not yes:
                return
            rid = self.next_rid
            self.next_rid += 1
            cached = self.alloc.admit(rid, prompt, shared)
            self._sync_copies()
            if not 0 <= cached < prompt.size:
                raise AssertionError(f"admit({rid}) says {cached} of {prompt.size} prompt tokens are cached")
            if self.model is not None:
                _agree(f"admit({rid}) matched length", cached, self.model.admit(rid, prompt, shared))
            tokens = np.concatenate([prompt, _tokens(rid + 1, outputs)])
            self.reqs[rid] = dict(tokens=tokens, prompt=prompt.size, shared=shared, done=cached)
            self.history.append(prompt)
            promise = {rid: prompt.size - cached + reserve}
            if not self.alloc.can_extend(promise):
                raise PromiseBroken(f"over-admission: can_admit said yes to request {rid} (prompt {prompt.size}, "
                                    f"{cached} cached, reserve {reserve}), then can_extend({promise}) says no")
            if self.model is not None:
                _agree(f"can_extend({promise}) after admit", True, self.model.can_extend(promise))
            while now and rid in self.reqs and self.reqs[rid]["done"] < prompt.size:
                self.prefill_one(rid, now)

        def prefill_one(self, rid: int, chunk: int) -> None:
            """One prefill chunk of ``rid``; a request that cannot grow is preempted."""
            r = self.reqs[rid]
            n = min(chunk, r["prompt"] - r["done"])
            yes = self.alloc.can_extend({rid: n})
            if self.model is not None:
                _agree(f"can_extend({{{rid}: {n}}})", yes, self.model.can_extend({rid: n}))
            if not yes:
                self._release(rid, None)
                return
            self._extend(rid, n, f"can_extend({{{rid}: {n}}})")
            if r["shared"] and r["done"] >= r["shared"] and not r.get("cached_shared"):
                r["cached_shared"] = True
                self.alloc.cache_prefix(rid, r["tokens"][: r["shared"]])
                self._sync_copies()
                if self.model is not None:
                    self.model.cache_prefix(rid, r["tokens"][: r["shared"]])

        @precondition(lambda self: any(r["done"] < r["prompt"] for r in self.reqs.values()))
        @rule(pick=st.integers(0, 10**6), chunk=st.one_of(st.integers(1, 8), st.integers(1, 64),
                                                            st.integers(-10**6, -1)))
        def prefill(self, pick, chunk):
            """One prefill chunk (an edge length when ``chunk`` is negative); a request that cannot
            grow is preempted mid-prefill."""
            rid = self._pick(pick, lambda r: r["done"] < r["prompt"])
            if chunk < 0:
                edges = self._edges()
                chunk = edges[-chunk % len(edges)]
            self.prefill_one(rid, chunk)

        @precondition(lambda self: self.reqs)
        @rule(pick=st.integers(0, 10**6))
        def preempt(self, pick):
            self._release(self._pick(pick, lambda r: True), None)

        @precondition(lambda self: any(r["prompt"] <= r["done"] < r["tokens"].size for r in self.reqs.values()))
        @rule(pick=st.integers(0, 10**6))
        def decode(self, pick):
            rid = self._pick(pick, lambda r: r["prompt"] <= r["done"] < r["tokens"].size)
            yes = self.alloc.can_extend({rid: 1})
            if self.model is not None:
                _agree(f"can_extend({{{rid}: 1}})", yes, self.model.can_extend({rid: 1}))
            if yes:
                self._extend(rid, 1, f"can_extend({{{rid}: 1}})")

        @precondition(lambda self: any(r["prompt"] <= r["done"] < r["tokens"].size for r in self.reqs.values()))
        @rule(mask=st.integers(1, 2**12 - 1), n=st.sampled_from([1, 1, 2, 3]))
        def decode_batch(self, mask, n):
            """The scheduler's decode step: one batched question and one batched extend."""
            ready = sorted(r for r, q in self.reqs.items() if q["prompt"] <= q["done"] <= q["tokens"].size - n)
            rids = [r for i, r in enumerate(ready) if mask >> (i % 12) & 1]
            if not rids:
                return
            yes = self.alloc.can_extend_all(rids, n)
            _agree(f"can_extend_all({rids}, {n}) vs can_extend", yes, self.alloc.can_extend({r: n for r in rids}))
            if self.model is not None:
                _agree(f"can_extend_all({rids}, {n})", yes, self.model.can_extend({r: n for r in rids}))
            if not yes:
                return
            try:
                out = self.alloc.extend_all(rids, n)
            except Exception as err:
                raise PromiseBroken(f"can_extend_all({rids}, {n}) said yes, then extend_all raised {err!r}") from err
            if len(out) != len(rids):
                raise PromiseBroken(f"extend_all({rids}, {n}) returned {len(out)} slot arrays")
            for rid, slots in zip(rids, out):
                self._written(rid, n, slots)
                if self.model is not None and not self.model.extend(rid, n):
                    raise ModelMismatch(f"extend_all: request {rid} grew; the reference model has no room")

        @precondition(lambda self: self.reqs)
        @rule(pick=st.integers(0, 10**6), cache=st.booleans())
        def finish(self, pick, cache):
            rid = self._pick(pick, lambda r: True)
            r = self.reqs[rid]
            self._release(rid, r["tokens"][: r["done"]] if cache else None)

        @precondition(lambda self: self.history)
        @rule(pick=st.integers(0, 10**6), length=st.integers(1, 64))
        def lookup(self, pick, length):
            q = self.history[pick % len(self.history)][:length]
            slots = np.asarray(self.alloc.lookup(q))
            if slots.size > q.size or not np.array_equal(self.shadow[slots], q[: slots.size]):
                raise AssertionError(f"lookup of {q.size} tokens: the {slots.size} matched slots hold other tokens")
            if self.model is not None:
                _agree(f"lookup of {q.size} tokens: matched length", int(slots.size), self.model.match(q)[1])

        @rule(n=st.one_of(st.integers(1, 8), st.integers(1, 200), st.just(0)))
        def evict(self, n):
            """Evict ``n`` cached private tokens; 0 clears the whole cache."""
            freed = self.alloc.evict(n) if n else self.alloc.clear_cache()
            self._sync_copies()
            if self.model is not None:
                _agree(f"evict({n}) tokens freed" if n else "clear_cache() tokens freed", freed,
                       self.model.evict(n) if n else self.model.clear_cache())

        @rule(rebalance=st.booleans())
        def maintain(self, rebalance):
            """What the scheduler does between steps: ``rebalance`` (adaptive HOT) or ``compact``."""
            if rebalance:
                self.alloc.rebalance()
                self._sync_copies()
                self._boundary_moves_over_free()
                if self.model is not None:
                    self.model.rebalance(self._hot_delta())
            else:
                self.alloc.compact()
                self._sync_copies()

        # ---- invariants ------------------------------------------------------------------
        @invariant()
        def slots_tile_every_pool(self):
            cap = self.alloc.capacity
            bounds, free = self.alloc.pool_bounds(), self.alloc.free_slots()
            inside = np.zeros(cap, np.int64)
            for name, (lo, hi) in bounds.items():
                if not 0 <= lo <= hi <= cap:
                    raise AssertionError(f"pool {name} spans [{lo}, {hi}) outside [0, {cap})")
                inside[lo:hi] += 1
            if (inside > 1).any():
                raise AssertionError(f"slot {int(np.flatnonzero(inside > 1)[0])} lies in two pools")
            runs = [(name, np.asarray(free[name]), "free") for name in bounds]
            runs += [(pool, np.asarray(slots), f"{kind} {oid}") for kind, oid, pool, slots in self.alloc.ownership()]
            for pool, slots, who in runs:
                lo, hi = bounds[pool]
                if slots.size and (slots.min() < lo or slots.max() >= hi):
                    bad = slots[(slots < lo) | (slots >= hi)][0]
                    raise AssertionError(f"{pool}: slot {int(bad)} ({who}) is outside the pool [{lo}, {hi})")
            seen = np.bincount(np.concatenate([r[1] for r in runs]).astype(np.int64), minlength=cap)
            if (seen > 1).any():
                raise AssertionError(f"slot {int(np.flatnonzero(seen > 1)[0])} is owned twice or both owned and free")
            lost = np.flatnonzero((seen == 0) & (inside == 1))
            if lost.size:
                raise AssertionError(f"slot {int(lost[0])} is neither free nor owned (lost)")
            if bounds != self.bounds:
                self._boundary_moves_over_free(bounds, free)

        def _boundary_moves_over_free(self, bounds=None, free=None):
            """Called right after the calls that may move a boundary (``can_admit``, ``rebalance``):
            every slot that changed pool must be free in its new pool (an owned slot that crossed
            shows up in the tiling check as owned outside its pool)."""
            bounds = self.alloc.pool_bounds() if bounds is None else bounds
            if bounds == self.bounds:
                return
            free = self.alloc.free_slots() if free is None else free
            for name, (lo, hi) in bounds.items():
                olo, ohi = self.bounds.get(name, (lo, hi))
                came = np.setdiff1d(np.arange(lo, hi), np.arange(olo, ohi))
                if np.setdiff1d(came, free[name]).size:
                    raise AssertionError(f"{name}: the pool boundary moved across slots that are not free")
            self.bounds = bounds

        @invariant()
        def counts_and_tree(self):
            stats = self.alloc.stats()
            runs = self.alloc.cached_runs()
            by_id = {r.id: r for r in runs}
            owned = self.alloc.ownership()
            for name, ps in stats.pools.items():
                if ps.free + ps.used + ps.cached != ps.capacity or min(ps.free, ps.used, ps.cached) < 0:
                    raise AssertionError(f"{name}: free {ps.free} + used {ps.used} + cached {ps.cached} "
                                         f"!= capacity {ps.capacity}")
                n_owned = sum(np.asarray(o[3]).size for o in owned if o[2] == name)
                if n_owned != ps.used + ps.cached:
                    raise AssertionError(f"{name}: {n_owned} owned slots but used+cached={ps.used + ps.cached}")
                cached = sum(r.tokens.size for r in runs if r.pool == name and not r.locked)
                if cached != ps.cached:
                    raise AssertionError(f"{name}: stats say {ps.cached} cached, unlocked runs hold {cached}")
            for r in runs:
                if r.parent and r.parent not in by_id:
                    raise AssertionError(f"cached run {r.id} hangs off a missing run {r.parent}")
                if r.locked and r.parent and not by_id[r.parent].locked:
                    raise AssertionError(f"run {r.id} is locked but its parent {r.parent} is not")
                if r.tokens.size != r.slots.size or r.tokens.size == 0 or r.tokens.size % self.alloc.page_size:
                    raise AssertionError(f"cached run {r.id}: {r.tokens.size} tokens, {r.slots.size} slots")
                if r.pool == "hot" and not (np.diff(r.slots) == 1).all():
                    raise AssertionError(f"HOT run {r.id} is not one contiguous slab")
                if not np.array_equal(self.shadow[r.slots], r.tokens):
                    raise AssertionError(f"cached run {r.id} maps to other tokens")
            if self.model is not None:
                self._compare_with_model(stats, runs, by_id, owned)

        def _compare_with_model(self, stats, runs, by_id, owned):
            m = self.model
            real = {n: (ps.capacity, ps.free, ps.used, ps.cached) for n, ps in stats.pools.items()}
            _agree("pool (capacity, free, used, cached)", real, m.pool_counts())
            _agree("counters", {k: getattr(stats, k) for k in m.counters}, m.counters)
            shape = set()
            for r in runs:
                path, x = [], r
                while True:
                    path = r_tokens(x) + path
                    if not x.parent:
                        break
                    x = by_id[x.parent]
                shape.add((tuple(path), r.pool, r.locked))
            if shape != m.shape():
                extra, missing = sorted(shape - m.shape()), sorted(m.shape() - shape)
                raise ModelMismatch(f"prefix tree differs: only in the allocator {extra[:2]}, "
                                    f"only in the model {missing[:2]}")
            for rid in self.reqs:
                held = {}
                for kind, oid, pool, slots in owned:
                    if kind == "request" and oid == rid:
                        held[pool] = held.get(pool, 0) + np.asarray(slots).size
                want = m.held(rid)
                _agree(f"slots request {rid} holds per pool", {p: held.get(p, 0) for p in want}, want)

        @invariant()
        def layouts_hold_own_tokens(self):
            page = self.alloc.page_size
            owned = self.alloc.ownership()
            store = [n for n in self.alloc.pool_bounds() if n != "hot"]
            for rid, r in self.reqs.items():
                lay = self.alloc.layout(rid)
                slots = lay.slots()
                if not (lay.num_tokens == r["done"] == slots.size):
                    raise AssertionError(f"request {rid}: layout has {slots.size} slots for {r['done']} tokens")
                if not np.array_equal(self.shadow[slots], r["tokens"][: r["done"]]):
                    raise AssertionError(f"request {rid}: layout maps to other tokens")
                held = sum(np.asarray(o[3]).size for o in owned if o[0] == "request" and o[1] == rid and o[2] in store)
                written = sum(len(s.slots) for s in lay.segments if s.pool in store)
                node_slots = {int(x) for o in owned if o[0] == "node" for x in np.asarray(o[3])}
                mine = [int(x) for s in lay.segments if s.pool in store for x in s.slots if int(x) not in node_slots]
                if held - len(mine) >= page or held < len(mine):
                    raise AssertionError(f"request {rid}: holds {held} private slots for {len(mine)} written tokens "
                                         f"(page {page}; {written} in its layout)")

        def teardown(self):
            for rid in list(self.reqs):
                self.alloc.release(rid)
            self.alloc.clear_cache()
            for name, ps in self.alloc.stats().pools.items():
                if ps.free != ps.capacity:
                    raise AssertionError(f"{name}: {ps.capacity - ps.free} slots not returned after releasing all")

    AllocatorMachine.__name__ = "AllocatorMachine"
    return AllocatorMachine


def _tokens(seed: int, n: int) -> np.ndarray:
    """``n`` tokens drawn from ``seed`` (seed 0: all zeros)."""
    if seed == 0:
        return np.zeros(n, np.int64)
    return np.random.default_rng(seed).integers(0, VOCAB, n).astype(np.int64)


def r_tokens(run) -> list[int]:
    return [int(t) for t in run.tokens]


def fuzz_settings(examples: int, steps: int = 30, *, report_multiple: bool = True) -> hsettings:
    """Settings for one fuzz run; ``report_multiple=False`` stops at the first failure found
    (what a planted-bug test wants), True shrinks and reports every distinct one."""
    return hsettings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                     report_multiple_bugs=report_multiple, suppress_health_check=list(HealthCheck))
