"""What the router sees: frozen, read-only views of a request and of each replica.

A :class:`ReplicaView` is built from a replica's scheduler and allocator without changing
either (no radix match, which would split nodes and touch LRU clocks): the role prefixes a
replica holds are found by walking its radix index read-only. The walk is redone only
when the index changed shape since the last view (a node created or removed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from granisim.kv.radix import RadixIndex


@dataclass(frozen=True, slots=True)
class RequestView:
    rid: int
    arrival_s: float
    prompt_len: int
    output_len: int
    shared_len: int  # tokens of the declared shared (role) prefix
    role: int = -1  # -1: no role
    session: int = -1
    turn: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaView:
    index: int
    up: bool = True
    waiting: int = 0  # requests queued
    running: int = 0  # requests admitted
    outstanding_tokens: int = 0  # prompt tokens still to compute + outputs still to generate, all queued/running
    tokens_in_flight: int = 0  # KV tokens held by running requests
    free_kv: int = 0  # private-pool tokens obtainable now (free + evictable)
    kv_capacity: int = 0
    hot_capacity: int = 0  # HOT pool tokens (0: not granikv)
    cached_roles: frozenset[int] = frozenset()  # roles whose whole prefix is in the radix index
    hot_roles: frozenset[int] = frozenset()  # ... held as one HOT slab (granikv)
    taken_s: float = 0.0  # when the view was taken

    @property
    def load(self) -> int:
        """Requests on the replica (SGLang's router balances on this)."""
        return self.waiting + self.running


def request_view(spec) -> RequestView:
    return RequestView(spec.rid, spec.arrival_s, spec.prompt_len, spec.output_len, spec.shared_len, spec.role,
                       spec.session, spec.turn)


def cached_prefix(radix: RadixIndex, tokens: np.ndarray) -> tuple[int, bool]:
    """(tokens of ``tokens`` cached, all of them in the HOT pool) — read-only, unlike match_prefix."""
    node, pos, hot, ps = radix.root, 0, True, radix.page_size
    while pos + ps <= tokens.size:
        child = node.children.get(tuple(tokens[pos : pos + ps].tolist()))
        if child is None:
            break
        k = min(len(child), tokens.size - pos)
        neq = np.flatnonzero(child.key[:k] != tokens[pos : pos + k])
        m = int(neq[0]) if neq.size else k
        m -= m % ps
        if m == 0:
            break
        hot = hot and child.pool == "hot"
        pos += m
        if m < len(child):
            break
        node = child
    return pos, hot and pos > 0


class RoleCache:
    """Per replica: which role prefixes its radix index holds, recomputed only after the index changed."""

    def __init__(self, prefixes: list[np.ndarray]):
        self.prefixes = prefixes
        self._key = None
        self._value = (frozenset(), frozenset())

    def roles(self, radix: RadixIndex) -> tuple[frozenset[int], frozenset[int]]:
        key = (radix, radix._next_id, radix.num_nodes)  # the index itself: a new incarnation's never matches
        if self._key is None or key[0] is not self._key[0] or key[1:] != self._key[1:]:
            cached, hot = [], []
            ps = radix.page_size
            for role, p in enumerate(self.prefixes):
                need = p.size - p.size % ps
                got, in_hot = cached_prefix(radix, p)
                if need and got >= need:
                    cached.append(role)
                    if in_hot:
                        hot.append(role)
            self._key, self._value = key, (frozenset(cached), frozenset(hot))
        return self._value


class LoadCache:
    """Per replica: its outstanding and in-flight token sums, recomputed only when its requests may have changed.

    They change only when the loop records a step (tokens computed and generated), admits, preempts, expires
    or finishes a request, or is given one; the key below changes with each of those. Without it every
    arrival walked every replica's queued and running requests (a cost growing with replicas x load)."""

    def __init__(self):
        self._key = None
        self._value = (0, 0)
        self.submitted = 0  # requests given to the replica (its Replica counts them)

    def sums(self, loop) -> tuple[int, int]:
        sched = loop.scheduler
        key = (loop, len(loop.steps), len(sched.waiting), len(sched.running), sched.preemptions, len(sched.records),
               self.submitted)
        if key[0] is not (self._key[0] if self._key else None) or key[1:] != self._key[1:]:
            self._key, self._value = key, _load_sums(sched)
        return self._value


def _load_sums(sched) -> tuple[int, int]:
    outstanding = 0
    for r in sched.waiting:
        outstanding += r.n_tokens - r.computed + r.remaining_output
    in_flight = 0
    for r in sched.running.values():
        outstanding += r.n_tokens - r.computed + r.remaining_output
        in_flight += r.computed
    return outstanding, in_flight


def replica_view(index: int, loop, roles: RoleCache | None, now: float, up: bool = True,
                 load: LoadCache | None = None) -> ReplicaView:
    """A frozen snapshot of one replica (``loop`` is its ServingLoop; None when it is down)."""
    if loop is None or not up:
        return ReplicaView(index, up=False, taken_s=now)
    sched, alloc = loop.scheduler, loop.allocator
    outstanding, in_flight = load.sums(loop) if load is not None else _load_sums(sched)
    cached, hot = roles.roles(alloc.radix) if roles is not None else (frozenset(), frozenset())
    return ReplicaView(index, True, len(sched.waiting), len(sched.running), outstanding, in_flight,
                       alloc.available(), alloc.capacity, alloc.hot.capacity if alloc.hot is not None else 0,
                       cached, hot, now)
