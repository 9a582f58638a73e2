"""The fleet: N replicas behind a router in one SimPy environment.

    arrival ─► views (refreshed every staleness_s) ─► router ─► replica i.submit(request)

Each replica is the single-GPU serving loop, unchanged, running as one process. Arrivals
(first turns from the workload, follow-up turns when a turn finishes, requests handed back
by a replica that went down) are delivered at their times with the same URGENT priority as
the single loop uses, routed, and queued on the chosen replica. While every replica is
down, arrivals wait at the router; those still waiting when the run ends (every replica
down for good) are rejected with that reason. Replicas' fast-forward blocks stop at the
first step boundary after a request is routed to them (as the single loop's do at an arrival).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from granisim.core.progress import request_bar
from granisim.core.request import JoinedRecords, RequestRecord, RequestRecords, unsent_turns
from granisim.core.serving_loop import UrgentTimeout
from granisim.core.workload import ArrivalQueue, Workload
from granisim.fleet.replica import Replica, ReplicaSpec
from granisim.fleet.routers import Router, initial_state, reads_no_request, reads_only_up
from granisim.fleet.views import ReplicaView, request_view

NO_REPLICA = -1  # the `replica` of a request rejected at the router


class FleetRecords:
    """The fleet's request records as (replica, :class:`RequestRecord`) pairs: the router's rejections
    (replica NO_REPLICA), then each replica's, incarnation by incarnation, each part kept as its serving
    loop's :class:`RequestRecords` columns. ``requests`` reads them as one (the records alone, for
    ``requests_frame``); ``replicas()`` gives each record's replica in the same order."""

    __slots__ = ("_parts", "requests")

    def __init__(self, parts: list[tuple[int, RequestRecords]]):
        self._parts = parts  # empty parts add nothing to either reading
        self.requests = JoinedRecords([recs for _, recs in parts])

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        for i, recs in self._parts:
            for r in recs:
                yield i, r

    def replicas(self) -> np.ndarray:
        return np.concatenate([np.full(len(recs), i, dtype=np.int64) for i, recs in self._parts]
                              or [np.zeros(0, dtype=np.int64)])


@dataclass
class FleetResult:
    records: FleetRecords
    replicas: list[Replica]
    end_s: float
    rerouted: dict[int, int] = field(default_factory=dict)  # rid -> times handed back by a failing replica
    recomputed: int = 0  # hand-backs of requests that had started (their work was lost)
    router: str = ""
    decisions: int = 0


class FleetLoop:
    def __init__(self, specs: list[ReplicaSpec], fleet_cfg, make_executor, *, progress: bool = True,
                 keep_outputs: bool = False, router: Router | None = None):
        base = specs[0].setup
        s = base.scenario
        self.cfg = fleet_cfg
        self.progress = progress
        self.keep_outputs = keep_outputs  # each replica keeps rid -> generated tokens (correctness checks)
        self.workload = Workload(s.workload, s.seed, base.trace, base.model.vocab)
        self.replicas = [Replica(sp, make_executor, self, self.workload.prefixes) for sp in specs]
        n = len(self.replicas)
        self.router = router or Router(fleet_cfg.router, initial_state(fleet_cfg.router, fleet_cfg, n, s.seed,
                                                                       len(self.workload.prefixes)))
        self._views: list = [None] * n
        self._blind = reads_no_request(self.router.policy)  # route(None, ...): no request view per arrival
        # a router that reads only whether each replica is up (round robin) gets these, not the full views
        # (the same answers: the full views' ``up`` is always the replica's own, stale or not)
        self._up_views = [(ReplicaView(i, up=False), ReplicaView(i, up=True)) for i in range(n)] \
            if reads_only_up(self.router.policy) else None
        # which replicas are up changes only when one starts, fails or recovers (_up_changed): until then
        # every arrival is routed on the same answers, not on a pass over the replicas
        self._any_up = False
        self._up_now: tuple = ()  # the views of _up_views as the replicas are now
        self._views_s = float("-inf")
        self._held = []  # arrivals while every replica is down
        self._arriving = 0  # arrival processes still delivering
        self._recovering = 0  # faults that have begun and will end (a replica coming back)
        self._done: simpy.Event | None = None  # no work left: faults still to come change nothing
        self.rerouted: dict[int, int] = {}
        self.recomputed = 0

    # ---- the feed the replicas call back ------------------------------------------------------
    def finished(self, request, outputs, now: float) -> None:
        self._bar.update(1)
        nxt = self.workload.follow_up(request.spec, outputs, now)
        if nxt is not None:
            self._bar.total += 1
            self._add_arrivals([nxt])

    # ---- running ----------------------------------------------------------------------------------
    def run(self) -> FleetResult:
        env = self.env = simpy.Environment()
        initial = self.workload.initial_specs()  # each spec built when it comes up
        self._bar = request_bar(len(initial), self.progress)
        for f in self.cfg.faults:  # first: a fault due at t is seen by the arrivals at t (t = 0 too)
            env.process(self._fault(f))
        self._add_arrivals(initial)  # before the engines, as the single loop orders its processes
        for rep in self.replicas:
            rep.start(env)
        self._up_changed()
        self._done = env.event()
        try:  # the run ends with its work: a fault due later would only move the clock (and the run's span)
            env.run(until=self._done)
        except RuntimeError:
            if self._done.triggered or env.peek() != float("inf"):
                raise
        self._bar.close()
        parts = [(NO_REPLICA, RequestRecords(self._reject(spec, "no replica up (every replica down for good)")
                                             for spec in self._held))]
        for rep in self.replicas:
            rep.finish(env.now)
            parts.extend((rep.index, recs) for recs in rep.records)
        unsent = unsent_turns((r for _, recs in parts for r in recs), self.workload)
        if unsent:  # never routed: under replica -1, beside the rejections with no replica up
            parts.append((NO_REPLICA, RequestRecords(unsent)))
        return FleetResult(FleetRecords(parts), self.replicas, env.now, self.rerouted, self.recomputed,
                           self.router.name, self.router.decisions)

    def _add_arrivals(self, specs) -> None:
        self._arriving += 1
        self.env.process(self._arrivals(ArrivalQueue(specs)))

    def _arrivals(self, queue: ArrivalQueue):
        while len(queue):
            spec = queue.pop()
            yield UrgentTimeout(self.env, max(0.0, spec.arrival_s - self.env.now))
            self._route(spec)
        self._arriving -= 1
        self.idle()

    def idle(self) -> None:
        """A replica ran out of work (or an arrival process ended): end the run if the whole fleet has, so that
        a fault due after the last request changes neither the run's end nor its figures. Requests held with
        every replica down wait only for a fault that has begun to end (a fault to come brings none back)."""
        if self._done is None or self._done.triggered or self._arriving:
            return
        if self._held and self._recovering:
            return
        if any(rep.loop is not None and rep.loop.scheduler.has_work for rep in self.replicas):
            return
        self._done.succeed()

    def _fault(self, f):
        """A replica down at ``f.at_s`` before anything is routed at that instant (URGENT, as arrivals are, and
        scheduled before them), its requests re-routed once every fault of the instant has struck (so none goes to
        a replica failing then too); back up after ``f.for_s`` (or never)."""
        env, rep = self.env, self.replicas[f.replica]
        yield UrgentTimeout(env, f.at_s)
        specs, started = rep.fail(env.now)
        self._views[rep.index] = None
        self._up_changed()
        yield UrgentTimeout(env, 0.0)  # the instant's other faults strike first
        self.recomputed += started
        for spec in specs:
            self.rerouted[spec.rid] = self.rerouted.get(spec.rid, 0) + 1
            self._route(spec)
        if f.for_s is None:
            self.idle()  # the last busy replica may have gone for good with every other one down
            return
        self._recovering += 1
        yield env.timeout(f.for_s)
        self._recovering -= 1
        if rep.recover(env):
            self._views[rep.index] = None
            self._up_changed()
            held, self._held = self._held, []
            for spec in held:
                self._route(spec)
        self.idle()

    # ---- routing ----------------------------------------------------------------------------------
    def _current_views(self) -> list:
        now = self.env.now
        st = self.cfg.staleness_s
        if now - self._views_s >= st or st == 0:
            self._views = [rep.view(now) for rep in self.replicas]
            self._views_s = now
        else:  # stale, but a replica's going down or up is seen at once (health checks)
            for i, rep in enumerate(self.replicas):
                v = self._views[i]
                if v is None:
                    self._views[i] = rep.view(now)
                elif v.up != rep.up:
                    self._views[i] = replace(v, up=rep.up)
        return self._views

    def _up_changed(self) -> None:
        """A replica started, went down or came back: recompute what routing reads of who is up."""
        self._any_up = any(rep.up for rep in self.replicas)
        if self._up_views is not None:
            self._up_now = tuple(pair[rep.up] for pair, rep in zip(self._up_views, self.replicas))

    def _route(self, spec) -> None:
        if not self._any_up:
            self._held.append(spec)
            return
        if self._up_views is not None:
            views = self._up_now
        else:
            views = self._current_views()
        i = self.router.route(None if self._blind else request_view(spec), views)
        self.replicas[i].submit(spec)

    def _reject(self, spec, reason: str) -> RequestRecord:
        return RequestRecord(spec.rid, spec.role, spec.session, spec.turn, spec.arrival_s, spec.prompt_len,
                             spec.output_len, "rejected", reason, finish_s=self.env.now)
