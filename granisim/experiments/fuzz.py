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

import contextlib
import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from granisim.core.heap import fewer_collections
from granisim.experiments.fuzz_model import ModelMismatch, ReferenceModel
from granisim.kv.allocator import make_allocator
from granisim.kv.host_invariants import check_host_tier, check_transfers, replay
from granisim.kv.host_tier import HostTierConfig
from granisim.kv.protocol import AllocatorProtocol

VOCAB = 6  # tiny vocabulary: many partial matches, hence many node splits
_rng = np.random.default_rng(5)
AGENT_PREFIXES = [_rng.integers(0, VOCAB, 56).astype(np.int64) for _ in range(6)]
FUZZ_CAPACITY = 160
FUZZ_HOT_FRACTION = 0.25
FUZZ_PAGE = 4
POLICIES = ("granikv", "granikv-adaptive", "token", "paged")
# with the host KV tier on (granisim/kv/host_tier.py): "<policy>-host", a host pool smaller than the
# traffic (host eviction happens), each policy in the tier mode and host eviction it is fuzzed with
FUZZ_HOST_CAPACITY = 96
FUZZ_HOST_BYTES_PER_TOKEN = 2
HOST_MODES = {"granikv": ("slabs", "lru"), "granikv-adaptive": ("slabs+pages", "next_use"),
              "token": ("slabs+pages", "lru"), "paged": ("slabs+pages", "next_use")}
HOST_POLICIES = tuple(f"{p}-host" for p in POLICIES)


def host_policy(policy: str) -> str:
    """The fuzz policy name of ``policy`` with the host tier on (``granikv`` -> ``granikv-host``)."""
    return policy if policy.endswith("-host") else f"{policy}-host"


def _host(policy: str) -> tuple[str, HostTierConfig | None]:
    if not policy.endswith("-host"):
        return policy, None
    base = policy[: -len("-host")]
    if base not in HOST_MODES:
        raise ValueError(f"unknown fuzz policy {policy!r}; choose one of {', '.join(POLICIES + HOST_POLICIES)}")
    mode, eviction = HOST_MODES[base]
    return base, HostTierConfig(FUZZ_HOST_CAPACITY, FUZZ_HOST_BYTES_PER_TOKEN, mode, eviction)


def _config(policy: str) -> tuple[str, dict]:
    if policy == "granikv-adaptive":  # a short demand window so that HOT also shrinks within one example
        return "granikv", dict(hot_fraction="adaptive", demand_window=1)
    if policy == "granikv":
        return "granikv", dict(hot_fraction=FUZZ_HOT_FRACTION)
    if policy == "paged":
        return "paged", dict(page_size=FUZZ_PAGE)
    if policy == "token":
        return "token", {}
    raise ValueError(f"unknown fuzz policy {policy!r}; choose one of {', '.join(POLICIES + HOST_POLICIES)}")


def default_factory(policy: str) -> Callable[[], AllocatorProtocol]:
    """The allocator each fuzz policy name stands for (160 slots; ``-host``: with a host tier)."""
    base, host = _host(policy)
    name, kw = _config(base)
    return lambda: make_allocator(name, FUZZ_CAPACITY, host=host, **kw)


def default_model(policy: str) -> Callable[[], ReferenceModel] | None:
    """The reference model matching :func:`default_factory` (None with the host tier: the model
    has no host tier, whose prefetches change matched lengths and counts; the tier's own
    invariants are checked instead)."""
    base, host = _host(policy)
    if host is not None:
        return None
    name, kw = _config(base)
    return lambda: ReferenceModel(name, FUZZ_CAPACITY, **kw)


_M64 = 2**64 - 1


def _mix(x: int) -> int:
    """splitmix64 of ``x`` (0 stays 0, so the simplest choice decodes to the simplest parameters)."""
    if not x:
        return 0
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


class _Digits:
    """Mixed-radix digits of a 128-bit hash of one hypothesis integer: ``take(n)`` is the next
    digit in ``[0, n)``, ``low(n)`` one that is 0 a quarter of the time, as hypothesis draws the
    simplest value of a choice often: the first role, request and prompt, the shortest lengths and
    all-zero prompts are where prefixes are shared and eviction order matters."""
    __slots__ = ("z",)

    def __init__(self, x: int):
        self.z = _mix(x) | _mix(x ^ 0x5851F42D4C957F2D) << 64 if x else 0

    def take(self, n: int) -> int:
        self.z, d = divmod(self.z, n)
        return d

    def low(self, n: int) -> int:
        return self.take(n) if self.take(4) else 0


def _edge(d: _Digits, low: int) -> int:
    """A negative draw (an index into the edge lengths, ``low`` - index)."""
    return low - d.low(1024)


def _common(d: _Digits) -> dict:
    """The parameters every admission draws: ``length`` (half the time 1..48, else an edge length),
    ``fill`` (0: all zeros, else a token seed), outputs, reserve and ``now``."""
    return dict(length=1 + d.low(48) if not d.take(2) else _edge(d, -1), fill=d.low(2**16 + 1),
                outputs=1 + d.low(8), reserve=(0, 0, 1, 4)[d.low(4)], now=(0, 0, 1, 7, 64)[d.low(5)])


class Admit(NamedTuple):
    """Parameters of the ``admit`` rule (see its docstring)."""
    source: int
    reuse: int
    length: int
    fill: int
    outputs: int
    reserve: int
    now: int


class Role(NamedTuple):
    """Parameters of the ``admit_role`` rule: ``shared`` 0..16 or 0..48, or negative: an edge length
    (-1..-1024) or the cached part of the role's prompt plus a slab edge (below -10**6)."""
    role: int
    shared: int
    length: int
    fill: int
    outputs: int
    reserve: int
    now: int


class Prefill(NamedTuple):
    pick: int
    chunk: int


class Batch(NamedTuple):
    mask: int
    n: int


class Finish(NamedTuple):
    pick: int
    cache: bool


class Lookup(NamedTuple):
    pick: int
    length: int
    run: bool


class Evict(NamedTuple):
    n: int


# Each rule draws one integer ``x`` in [0, 2**64) (RULE_X) and decodes it into its parameters with one of
# these (``admit_params(x)`` and so on; 0 decodes to the simplest ones). A ``.map`` of the strategy would
# print the decoded tuple in a shrunk sequence, but costs hypothesis as much again per step.
RULE_X = st.integers(0, _M64)


def _decoded(make):
    def decode(x: int):
        return make(_Digits(x))
    return decode


def _role(d: _Digits) -> Role:
    role, kind = d.low(len(AGENT_PREFIXES)), d.low(4)
    shared = d.low(17 if kind == 0 else 49) if kind < 2 else _edge(d, -1 if kind == 2 else -10**6 - 1)
    return Role(role, shared, **_common(d))


def _prefill(d: _Digits) -> Prefill:
    pick, kind = d.low(2**20), d.low(3)
    return Prefill(pick, 1 + d.low(8) if kind == 0 else 1 + d.low(64) if kind == 1 else _edge(d, -1))


def _evict(d: _Digits) -> Evict:
    kind = d.low(3)
    return Evict(1 + d.low(8) if kind == 0 else 1 + d.low(200) if kind == 1 else 0)


admit_params = _decoded(lambda d: Admit(-1 - d.low(3), d.low(2**20), **_common(d)))
role_params = _decoded(_role)
prefill_params = _decoded(_prefill)
batch_params = _decoded(lambda d: Batch(1 + d.low(2**12 - 1), (1, 1, 2, 3)[d.low(4)]))
finish_params = _decoded(lambda d: Finish(d.low(2**20), bool(d.take(2))))
lookup_params = _decoded(lambda d: Lookup(d.low(2**20), 1 + d.low(64), bool(d.take(2))))
evict_params = _decoded(_evict)


class PromiseBroken(AssertionError):
    """The allocator said yes to a question and then could not deliver."""


def _agree(what: str, real, model) -> None:
    if real != model:
        raise ModelMismatch(f"{what}: allocator {real!r}, reference model {model!r}")


# The rules' preconditions, as named functions: hypothesis describes each precondition every time it
# checks one, and a lambda's description costs it a look-up that a function's name does not.
def _live(machine) -> bool:
    return bool(machine.reqs)


def _prefilling(machine) -> bool:
    return any(r["done"] < r["prompt"] for r in machine.reqs.values())


def _decoding(machine) -> bool:
    return any(r["prompt"] <= r["done"] < r["tokens"].size for r in machine.reqs.values())


def _admitted(machine) -> bool:
    return bool(machine.history)


def allocator_machine(factory: Callable[[], AllocatorProtocol],
                      model: Callable[[], ReferenceModel] | None = None) -> type[RuleBasedStateMachine]:
    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.alloc = factory()
            self.model = model() if model is not None else None
            self.shadow = np.full(self.alloc.capacity, -1, dtype=np.int64)
            # the host KV tier, when the allocator has one (ours: ``host=`` of make_allocator)
            self.tier = getattr(self.alloc, "host_tier", None) is not None
            self.host_shadow = np.full(self.alloc.host_tier.pool.capacity, -1, np.int64) if self.tier else None
            self.reqs: dict[int, dict] = {}  # rid -> tokens, prompt, shared, done
            self.history: list[np.ndarray] = []
            self.next_rid = 0
            self.bounds = self.alloc.pool_bounds()
            self.store = [n for n in self.bounds if n != "hot"]  # the private pools
            self.snap = None  # views read by the last invariant check (the state every rule starts from)

        # ---- helpers ---------------------------------------------------------------------
        def _sync_copies(self) -> list:
            """Replay the queued compaction copies (and host-tier transfers, in their exact
            interleaving) on the shadow arrays; returns the transfers."""
            copies = self.alloc.take_copies()
            if not self.tier:
                for c in copies:
                    self.shadow[c.dst : c.dst + c.length] = self.shadow[c.src : c.src + c.length].copy()
                return []
            transfers = self.alloc.take_transfers()
            check_transfers(self.alloc, transfers)
            replay(copies, transfers, self.shadow, self.host_shadow)
            return transfers

        def _hot_delta(self) -> int:
            if self.model is None or "hot" not in self.model.cap:
                return 0
            lo, hi = self.alloc.pool_bounds().get("hot", (0, 0))
            return (hi - lo) - self.model.cap["hot"]

        def _pick(self, pick: int, pred) -> int | None:
            rids = sorted(r for r, q in self.reqs.items() if pred(q))
            return rids[pick % len(rids)] if rids else None

        def _extend(self, rid: int, n: int) -> None:
            """``extend`` after ``can_extend({rid: n})`` said yes."""
            try:
                slots = self.alloc.extend(rid, n)
            except Exception as err:
                raise PromiseBroken(f"can_extend({{{rid}: {n}}}) said yes, then extend({rid}, {n}) raised "
                                    f"{err!r}") from err
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

        def _views(self):
            """(stats, free slots) of the current state: the last invariant check's when no rule
            has changed anything since (every rule reads them first thing)."""
            if self.snap is not None:
                return self.snap
            return self.alloc.stats(), self.alloc.free_slots()

        def _free_runs(self, free) -> set[int]:
            """Lengths of the runs of consecutive free slots of one pool."""
            if not free.size:
                return set()
            f = free.tolist()
            if any(a > b for a, b in zip(f, f[1:])):
                f.sort()
            out, start = set(), 0
            for i in range(1, len(f)):
                if f[i] != f[i - 1] + 1:
                    out.add(i - start)
                    start = i
            out.add(len(f) - start)
            return out

        def _edges(self) -> list[int]:
            """Lengths at the edges of the free space, of pages and of HOT: where off-by-ones live."""
            page = self.alloc.page_size
            stats, free_slots = self._views()
            out = [1, 2, page - 1, page, page + 1, 2 * page, 2 * page + 1]
            for ps in stats.pools.values():
                for base in (ps.free, ps.free + ps.cached, ps.capacity):
                    out += [base - 1, base, base + 1]
            for free in free_slots.values():  # each run of consecutive free slots: exact fits
                for run in self._free_runs(free):
                    out += [run - 1, run, run + 1]
            for r in self.reqs.values():  # a request's room left in its last page
                out.append(-r["done"] % page + 1)
            return [x for x in out if x >= 1]

        def _slab_edges(self) -> list[int]:
            """Slab lengths at the edges of HOT's free space (1 slot, each free run +- 1, exact
            fits, one more than a hole): the uncached part of a declared shared prefix."""
            _, free_slots = self._views()
            out = [1, 2]
            for run in self._free_runs(free_slots.get("hot", np.empty(0, np.int64))):
                out += [run - 1, run, run + 1]
            return [x for x in out if x >= 1]

        def _cached_match(self, tokens: np.ndarray) -> int:
            """Length of the longest cached prefix of ``tokens`` (from :meth:`cached_runs`, which
            reads without touching: no use for LRU), floored to pages, below the whole prompt."""
            runs = self.alloc.cached_runs()
            by_id = {r.id: r for r in runs}
            best = 0
            for r in runs:
                path, x = [r.tokens], r
                while x.parent:
                    x = by_id[x.parent]
                    path.append(x.tokens)
                p = np.concatenate(path[::-1])
                k = min(p.size, tokens.size - 1)
                neq = np.flatnonzero(p[:k] != tokens[:k])
                best = max(best, int(neq[0]) if neq.size else k)
            return best - best % self.alloc.page_size

        # ---- rules -----------------------------------------------------------------------
        # Each rule draws one integer, decoded into its parameters (see :func:`_decoded`): every
        # hypothesis choice costs more than most rules, so one choice per rule instead of several.

        @initialize(x=RULE_X)
        def first_admit(self, x):
            """Every example starts with one admission (rules are switched off at random per example)."""
            self.admit(x)

        @initialize(x=RULE_X)
        def first_role(self, x):
            """And with one agent role's admission."""
            self.admit_role(x)

        @rule(x=RULE_X)
        def admit_role(self, x):
            """An agent role's prompt: the first ``shared`` tokens of its system prompt (declared shared;
            in [-10**6, -1] an edge length, below -10**6 the cached part of the role's prompt plus a slab
            edge length), then its own text, ``length`` tokens in all (at least the shared part);
            the parameters are ``role_params(x)``."""
            a = role_params(x)
            self._admit(a.role, 0, a.length, a.shared, a.fill, a.outputs, a.reserve, a.now)

        @rule(x=RULE_X)
        def admit(self, x):
            """A prompt of ``length`` tokens (an edge length when negative): with ``source`` -1 a prefix
            of an earlier prompt, else its own tokens only, nothing declared shared (``admit_params(x)``)."""
            a = admit_params(x)
            self._admit(a.source, a.reuse, a.length, 0, a.fill, a.outputs, a.reserve, a.now)

        def _admit(self, source, reuse, length, shared, fill, outputs, reserve, now):
            """``fill`` seeds the prompt's own tokens (0 = all zeros); then ``outputs`` tokens to decode,
            ``reserve`` more asked of ``can_admit``. With ``now`` > 0 the prefill runs at once in chunks
            of ``now`` (else later, chunk by chunk, in ``prefill``)."""
            edges = self._edges() if length < 0 or -10**6 <= shared < 0 else None
            fill = _tokens(fill, 64)
            if length < 0:  # negative draws pick a boundary length
                length = edges[-length % len(edges)]
            if source >= 0 and shared < -10**6:
                slab = self._slab_edges()
                shared = self._cached_match(AGENT_PREFIXES[source]) + slab[(-shared - 10**6) % len(slab)]
            elif shared < 0:
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
            transfers = self._sync_copies()
            if not 0 <= cached < prompt.size:
                raise AssertionError(f"admit({rid}) says {cached} of {prompt.size} prompt tokens are cached")
            if self.model is not None:
                _agree(f"admit({rid}) matched length", cached, self.model.admit(rid, prompt, shared))
            tokens = np.concatenate([prompt, _tokens(rid + 1, outputs)])
            self.reqs[rid] = dict(tokens=tokens, prompt=prompt.size, shared=shared, done=cached)
            self.history.append(prompt)
            if transfers:  # a prefetch from host restores what it copies as cached prefix of this request
                prefix_slots = set(self.alloc.layout(rid).slots()[:cached].tolist())
                for t in transfers:
                    if t.direction == "to_gpu" and not set(t.gpu_slots.tolist()) <= prefix_slots:
                        raise AssertionError(f"admit({rid}): a run prefetched from host is not restored as the "
                                             f"request's cached prefix ({cached} tokens)")
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
            if self.model is not None and self.model.can_extend({rid: n}) != yes:  # (the message only on a mismatch)
                _agree(f"can_extend({{{rid}: {n}}})", yes, not yes)
            if not yes:
                self._release(rid, None)
                return
            self._extend(rid, n)
            if r["shared"] and r["done"] >= r["shared"] and not r.get("cached_shared"):
                r["cached_shared"] = True
                self.alloc.cache_prefix(rid, r["tokens"][: r["shared"]])
                self._sync_copies()
                if self.model is not None:
                    self.model.cache_prefix(rid, r["tokens"][: r["shared"]])

        @precondition(_prefilling)
        @rule(x=RULE_X)
        def prefill(self, x):
            """One prefill chunk (an edge length when ``chunk`` is negative); a request that cannot
            grow is preempted mid-prefill."""
            pick, chunk = prefill_params(x)
            rid = self._pick(pick, lambda r: r["done"] < r["prompt"])
            if chunk < 0:
                edges = self._edges()
                chunk = edges[-chunk % len(edges)]
            self.prefill_one(rid, chunk)

        @precondition(_live)
        @rule(pick=st.integers(0, 10**6))
        def preempt(self, pick):
            self._release(self._pick(pick, lambda r: True), None)

        @precondition(_decoding)
        @rule(pick=st.integers(0, 10**6))
        def decode(self, pick):
            rid = self._pick(pick, lambda r: r["prompt"] <= r["done"] < r["tokens"].size)
            yes = self.alloc.can_extend({rid: 1})
            if self.model is not None and self.model.can_extend({rid: 1}) != yes:
                _agree(f"can_extend({{{rid}: 1}})", yes, not yes)
            if yes:
                self._extend(rid, 1)

        @precondition(_decoding)
        @rule(x=RULE_X)
        def decode_batch(self, x):
            """The scheduler's decode step: one batched question and one batched extend."""
            mask, n = batch_params(x)
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

        @precondition(_live)
        @rule(x=RULE_X)
        def finish(self, x):
            pick, cache = finish_params(x)
            rid = self._pick(pick, lambda r: True)
            r = self.reqs[rid]
            self._release(rid, r["tokens"][: r["done"]] if cache else None)

        @precondition(_admitted)
        @rule(x=RULE_X)
        def lookup(self, x):
            """Look up the first ``length`` tokens of an earlier prompt or, with ``run``, the whole
            token path of a cached run (a use for LRU: that run must now outlive older ones)."""
            pick, length, run = lookup_params(x)
            q = self.history[pick % len(self.history)][:length]
            runs = self.alloc.cached_runs() if run else None
            if runs:
                by_id = {x.id: x for x in runs}
                x, path = runs[pick % len(runs)], []
                while True:
                    path.append(x.tokens)
                    if not x.parent:
                        break
                    x = by_id[x.parent]
                q = np.concatenate(path[::-1])
            slots = np.asarray(self.alloc.lookup(q))
            if slots.size > q.size or not np.array_equal(self.shadow[slots], q[: slots.size]):
                raise AssertionError(f"lookup of {q.size} tokens: the {slots.size} matched slots hold other tokens")
            if runs and slots.size != q.size:
                raise AssertionError(f"lookup of a cached run's whole path ({q.size} tokens) matched {slots.size}")
            if self.model is not None:
                _agree(f"lookup of {q.size} tokens: matched length", int(slots.size), self.model.match(q)[1])

        @rule(x=RULE_X)
        def evict(self, x):
            """Evict ``n`` cached private tokens; 0 clears the whole cache."""
            n = evict_params(x).n
            before = self._views()[0]
            freed = self.alloc.evict(n) if n else self.alloc.clear_cache()
            self._sync_copies()
            self._after_eviction(n, freed, before)
            if self.model is not None:
                _agree(f"evict({n}) tokens freed" if n else "clear_cache() tokens freed", freed,
                       self.model.evict(n) if n else self.model.clear_cache())

        def _after_eviction(self, n: int, freed: int, before) -> None:
            """What evict(n) / clear_cache() (n = 0) promise, whatever the policy: the tokens freed
            are exactly the cached tokens that went; clear_cache leaves no unlocked cached run; an
            evict that freed fewer than ``n`` leaves no unlocked cached leaf in the private pools."""
            after = self.alloc.stats()
            pools = self.store if n else list(after.pools)
            gone = sum(before.pools[p].cached - after.pools[p].cached for p in pools)
            what = f"evict({n})" if n else "clear_cache()"
            if freed != gone:
                raise AssertionError(f"{what} says it freed {freed} tokens; cached tokens fell by {gone}")
            if n and freed >= n:
                return
            runs = self.alloc.cached_runs()
            parents = {r.parent for r in runs}
            for r in runs:
                if not r.locked and (not n or (r.pool in self.store and r.id not in parents)):
                    raise AssertionError(f"{what} freed {freed} tokens and left unlocked cached run {r.id} "
                                         f"({r.tokens.size} tokens, {r.pool})")

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
        def allocator_is_consistent(self):
            """Every check of the module docstring, on views read once per step."""
            self.snap = None
            alloc = self.alloc
            bounds, free = alloc.pool_bounds(), alloc.free_slots()
            owned, runs, stats = alloc.ownership(), alloc.cached_runs(), alloc.stats()
            slots = [np.asarray(o[3]) for o in owned]  # the owned runs' slots, converted once for every check
            self._slots_tile_every_pool(bounds, free, owned, slots)
            self._counts_and_tree(stats, runs, owned, slots)
            self._layouts_hold_own_tokens(owned, slots)
            if self.tier:
                check_host_tier(alloc, self.host_shadow)
            self.snap = (stats, free)

        def _pool_map(self, bounds):
            """(pool index of every slot, -1 outside every pool; index of each pool name; 1 inside a
            pool; pool index padded with -2 on both sides; the pool names), cached while the bounds
            stay the same."""
            if getattr(self, "_map_bounds", None) != bounds:
                cap = self.alloc.capacity
                inside = np.zeros(cap, np.int64)
                pool_of = np.full(cap, -1, np.int64)
                names = list(bounds)
                for i, name in enumerate(names):
                    lo, hi = bounds[name]
                    if not 0 <= lo <= hi <= cap:
                        raise AssertionError(f"pool {name} spans [{lo}, {hi}) outside [0, {cap})")
                    inside[lo:hi] += 1
                    pool_of[lo:hi] = i
                if (inside > 1).any():
                    raise AssertionError(f"slot {int(np.flatnonzero(inside > 1)[0])} lies in two pools")
                self._map_bounds = dict(bounds)
                self._map = (pool_of, {n: i for i, n in enumerate(names)}, (pool_of >= 0).astype(np.int64),
                             np.concatenate([[-2], pool_of, [-2]]), names)
            return self._map

        def _slots_tile_every_pool(self, bounds, free, owned, slots):
            cap = self.alloc.capacity
            pool_of, index, inside, padded, names = self._pool_map(bounds)
            arrays = [np.asarray(free[name]) for name in names]
            arrays += slots
            want = [*range(len(names)), *(index[o[2]] for o in owned)]
            sizes = [a.size for a in arrays]
            allslots = np.concatenate(arrays).astype(np.int64, copy=False)
            listed = np.repeat(want, sizes)
            # the pool of every slot (-2 for one outside [0, capacity)) against the pool it is listed in
            if (padded.take(allslots + 1, mode="clip") != listed).any():
                ok = (allslots >= 0) & (allslots < cap)
                ok[ok] = pool_of[allslots[ok]] == listed[ok]
                k = int(np.flatnonzero(~ok)[0])
                at = int(np.searchsorted(np.cumsum(sizes), k, side="right"))
                pool, kind, oid = (names[at], "free", None) if at < len(names) else \
                    (owned[at - len(names)][2], owned[at - len(names)][0], owned[at - len(names)][1])
                lo, hi = bounds[pool]
                who = kind if oid is None else f"{kind} {oid}"
                raise AssertionError(f"{pool}: slot {int(allslots[k])} ({who}) is outside the pool [{lo}, {hi})")
            seen = np.bincount(allslots, minlength=cap)
            if (seen != inside).any():
                if (seen > 1).any():
                    raise AssertionError(f"slot {int(np.flatnonzero(seen > 1)[0])} is owned twice or both owned "
                                         "and free")
                lost = np.flatnonzero((seen == 0) & (pool_of >= 0))
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
                # the slots that came to this pool: [lo, hi) less [olo, ohi), at most two ranges
                came = [(a, b) for a, b in ((lo, min(hi, olo)), (max(lo, ohi), hi)) if a < b]
                if not came:
                    continue
                is_free = set(np.asarray(free[name]).tolist())
                if not all(s in is_free for a, b in came for s in range(a, b)):
                    raise AssertionError(f"{name}: the pool boundary moved across slots that are not free")
            self.bounds = bounds

        def _counts_and_tree(self, stats, runs, owned, slots):
            by_id = {r.id: r for r in runs}
            held, cached = {}, {}
            for o, s in zip(owned, slots):
                held[o[2]] = held.get(o[2], 0) + s.size
            for r in runs:
                if not r.locked:
                    cached[r.pool] = cached.get(r.pool, 0) + r.tokens.size
            for name, ps in stats.pools.items():
                if ps.free + ps.used + ps.cached != ps.capacity or min(ps.free, ps.used, ps.cached) < 0:
                    raise AssertionError(f"{name}: free {ps.free} + used {ps.used} + cached {ps.cached} "
                                         f"!= capacity {ps.capacity}")
                if held.get(name, 0) != ps.used + ps.cached:
                    raise AssertionError(f"{name}: {held.get(name, 0)} owned slots but used+cached="
                                         f"{ps.used + ps.cached}")
                if cached.get(name, 0) != ps.cached:
                    raise AssertionError(f"{name}: stats say {ps.cached} cached, unlocked runs hold "
                                         f"{cached.get(name, 0)}")
            page = self.alloc.page_size
            for r in runs:
                if r.parent and r.parent not in by_id:
                    raise AssertionError(f"cached run {r.id} hangs off a missing run {r.parent}")
                if r.locked and r.parent and not by_id[r.parent].locked:
                    raise AssertionError(f"run {r.id} is locked but its parent {r.parent} is not")
                if r.tokens.size != r.slots.size or r.tokens.size == 0 or r.tokens.size % page:
                    raise AssertionError(f"cached run {r.id}: {r.tokens.size} tokens, {r.slots.size} slots")
                if r.pool == "hot" and r.slots.size > 1 and r.slots[-1] - r.slots[0] != r.slots.size - 1:
                    raise AssertionError(f"HOT run {r.id} is not one contiguous slab")
            if runs:  # every cached run maps to its own tokens (one comparison; find the run on a mismatch)
                got = self.shadow[np.concatenate([r.slots for r in runs])]
                if (got != np.concatenate([r.tokens for r in runs])).any():  # same sizes: checked above
                    bad = next(r for r in runs if not np.array_equal(self.shadow[r.slots], r.tokens))
                    raise AssertionError(f"cached run {bad.id} maps to other tokens")
            if self.model is not None:
                self._compare_with_model(stats, runs, by_id, owned, slots)

        def _compare_with_model(self, stats, runs, by_id, owned, slots):
            m = self.model
            real = {n: (ps.capacity, ps.free, ps.used, ps.cached) for n, ps in stats.pools.items()}
            _agree("pool (capacity, free, used, cached)", real, m.pool_counts())
            _agree("counters", {k: getattr(stats, k) for k in m.counters}, m.counters)
            paths: dict[int, tuple[int, ...]] = {0: ()}

            def path(r):
                p = paths.get(r.id)
                if p is None:
                    p = paths[r.id] = path(by_id[r.parent]) + tuple(r.tokens.tolist()) if r.parent else \
                        tuple(r.tokens.tolist())
                return p

            shape = set()
            for r in runs:  # parents usually come first: one dict look-up per run
                above = paths.get(r.parent)
                p = paths[r.id] = above + tuple(r.tokens.tolist()) if above is not None else path(r)
                shape.add((p, r.pool, r.locked))
            want = m.shape()
            if shape != want:
                extra, missing = sorted(shape - want), sorted(want - shape)
                raise ModelMismatch(f"prefix tree differs: only in the allocator {extra[:2]}, "
                                    f"only in the model {missing[:2]}")
            held: dict[int, dict[str, int]] = {}
            for (kind, oid, pool, _), s in zip(owned, slots):
                if kind == "request":
                    h = held.setdefault(oid, {})
                    h[pool] = h.get(pool, 0) + s.size
            for rid in self.reqs:
                want, h = m.held(rid), held.get(rid, {})
                got = {p: h.get(p, 0) for p in want}
                if got != want:
                    _agree(f"slots request {rid} holds per pool", got, want)

        def _layouts_hold_own_tokens(self, owned, slots):
            if not self.reqs:
                return
            page = self.alloc.page_size
            store = self.store
            held: dict[int, int] = {}
            nodes = []  # slots owned by cached runs
            for o, s in zip(owned, slots):
                if o[0] == "node":
                    nodes.append(s)
                elif o[2] in store:
                    held[o[1]] = held.get(o[1], 0) + s.size
            layout = self.alloc.layout
            parts, tokens = [], []  # every layout's slots, in order; the tokens each request wrote
            written, wsizes, wreq, n_written = [], [], [], []  # the layouts' private-pool slots, per request
            for i, (rid, r) in enumerate(self.reqs.items()):
                lay = layout(rid)
                n = w = 0
                for seg in lay.segments:
                    sl = np.asarray(seg.slots)
                    parts.append(sl)
                    n += sl.size
                    if seg.pool in store:
                        written.append(sl)
                        wsizes.append(sl.size)
                        wreq.append(i)
                        w += sl.size
                done = r["done"]
                if not (lay.num_tokens == done == n):
                    raise AssertionError(f"request {rid}: layout has {n} slots for {done} tokens")
                tokens.append(r["tokens"][:done])
                n_written.append(w)
            # the written private slots that cached runs own; the rest are the request's own
            in_runs = [0] * len(n_written)
            if nodes and written:
                in_node = np.zeros(self.alloc.capacity, bool)
                in_node[np.concatenate(nodes)] = True
                hit = np.repeat(wreq, wsizes)[in_node[np.concatenate(written)]]
                if hit.size:
                    in_runs = np.bincount(hit, minlength=len(n_written)).tolist()
            for rid, w, shared in zip(self.reqs, n_written, in_runs):
                mine, h = w - shared, held.get(rid, 0)
                if h - mine >= page or h < mine:
                    raise AssertionError(f"request {rid}: holds {h} private slots for {mine} written tokens "
                                         f"(page {page}; {w} in its layout)")
            # every layout maps to its own tokens (one comparison; find the request on a mismatch)
            if parts and (self.shadow[np.concatenate(parts)] != np.concatenate(tokens)).any():
                for rid, r in self.reqs.items():
                    sl = self.alloc.layout(rid).slots()
                    if not np.array_equal(self.shadow[sl], r["tokens"][: sl.size]):
                        raise AssertionError(f"request {rid}: layout maps to other tokens")
                raise AssertionError("a layout maps to other tokens")

        def teardown(self):
            if self.reqs:  # clear the cache under live requests: only their locked paths may stay
                before = self.alloc.stats()
                freed = self.alloc.clear_cache()
                self._sync_copies()
                self._after_eviction(0, freed, before)
                if self.model is not None:
                    _agree("clear_cache() tokens freed (live requests)", freed, self.model.clear_cache())
            for rid in list(self.reqs):
                self.alloc.release(rid)
            self.alloc.clear_cache()
            self._sync_copies()
            for name, ps in self.alloc.stats().pools.items():
                if ps.free != ps.capacity:
                    raise AssertionError(f"{name}: {ps.capacity - ps.free} slots not returned after releasing all")
            if self.tier:
                check_host_tier(self.alloc, self.host_shadow)

    AllocatorMachine.__name__ = "AllocatorMachine"
    return AllocatorMachine


@functools.lru_cache(maxsize=4096)
def _tokens(seed: int, n: int) -> np.ndarray:
    """``n`` tokens drawn from ``seed`` (seed 0: all zeros); read-only, shared between calls."""
    out = np.zeros(n, np.int64) if seed == 0 else np.random.default_rng(seed).integers(0, VOCAB, n).astype(np.int64)
    out.flags.writeable = False
    return out


def r_tokens(run) -> list[int]:
    return [int(t) for t in run.tokens]


def fuzz_settings(examples: int, steps: int = 30, *, report_multiple: bool = True) -> hsettings:
    """Settings for one fuzz run; ``report_multiple=False`` stops at the first failure found
    (what a planted-bug test wants), True shrinks and reports every distinct one. No example
    database, deadline or health checks, and no explain phase (after shrinking, it re-runs the
    failing sequence under a line tracer and with its arguments varied, to annotate them: time
    that the printed rule sequence and the reproduction file do not need)."""
    return hsettings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                     report_multiple_bugs=report_multiple, suppress_health_check=list(HealthCheck),
                     phases=[p for p in Phase if p is not Phase.explain])


def rare_full_collections(threshold2: int = 10**3) -> contextlib.AbstractContextManager[None]:
    """Python's full (oldest-generation) garbage collections made rare for the length of a fuzz run.

    Hypothesis keeps every choice sequence it has tried (its data tree and result cache: about
    280,000 objects after 1,000 examples), and with the default threshold the collector walks all of
    them again each time they grow by a quarter: 2.0 of 26 s of CPU at 2,000 examples. Young
    generations are still collected as usual; cyclic garbage that reaches the oldest generation waits
    for its next collection (about 40 MB more peak memory at 2,000 examples).

    (``10**3``, not the literal: hypothesis draws some integers from the literals >= 100 of the code
    under test, so a new one would change which examples a seed explores.)"""
    return fewer_collections(full=threshold2)
