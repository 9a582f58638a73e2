"""One replica of a fleet: a serving loop (scheduler + allocator + executor) on ``tp`` GPUs.

A replica that goes down loses its KV cache and whatever its steps were computing: the
running engine process is interrupted, its queued and running requests are handed back
(to be routed again and recomputed from scratch), and when it comes back it starts with
an empty cache — a new serving loop, a new incarnation. What each incarnation finished
(records, step log, cache statistics) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import simpy

from granisim.core.metrics import StepLog
from granisim.core.serving_loop import ServingLoop
from granisim.fleet.views import LoadCache, ReplicaView, RoleCache, replica_view

ALLOC_COUNTERS = ("hot_placements", "hot_fallbacks", "hot_evictions", "compactions", "copied_tokens",
                  "evicted_tokens")


@dataclass(frozen=True)
class ReplicaSpec:
    index: int
    setup: object  # granisim.experiments.run.Setup: scenario (profile, policy), model, KV budget
    tp: int = 1  # GPUs of the replica (tensor parallel degree: the scenario's hardware.tp)
    group: int = 0


class Replica:
    def __init__(self, spec: ReplicaSpec, make_executor, feed, prefixes):
        self.spec = spec
        self.index = spec.index
        self._make_executor = make_executor
        self._feed = feed
        self.roles = RoleCache(prefixes)
        self.load = LoadCache()
        self.loop: ServingLoop | None = None
        self._proc: simpy.Process | None = None
        self._down = 0  # overlapping faults: up again when the last one ends
        self.records: list = []  # each finished incarnation's RequestRecords
        self._frames: list[pd.DataFrame] = []
        self.totals = dict(hit_tokens=0, lookup_tokens=0, evictions=0, preemptions=0, incarnations=0)
        self.executors: list = []
        self.outputs: dict = {}  # rid -> generated tokens, when the fleet keeps outputs
        self.alloc: dict[str, int] = {}  # allocator counters summed over incarnations (hot_capacity_end: the last)
        self.down_s = 0.0
        self._down_since = 0.0

    @property
    def up(self) -> bool:
        return self.loop is not None

    def start(self, env: simpy.Environment) -> None:
        setup = self.spec.setup
        executor = self._make_executor(setup)
        self.executors.append(executor)  # one per incarnation (validation reads its paired steps)
        self.loop = ServingLoop(setup, executor, progress=False, feed=self._feed,
                                keep_outputs=getattr(self._feed, "keep_outputs", False))
        self._proc = self.loop.start(env)
        self.totals["incarnations"] += 1

    def submit(self, spec) -> None:
        self.load.submitted += 1
        self.loop.submit(spec)

    def view(self, now: float) -> ReplicaView:
        return replica_view(self.index, self.loop, self.roles, now, self.up, self.load)

    def fail(self, now: float) -> tuple[list, int]:
        """Go down; returns (the specs of its queued and running requests, how many had started)."""
        self._down += 1
        if self.loop is None:
            return [], 0
        loop, sched = self.loop, self.loop.scheduler
        taken = list(sched.running.values()) + list(sched.waiting)
        started = sum(r.admitted_s is not None for r in taken)
        if self._proc is not None and self._proc.is_alive:
            self._proc.interrupt("replica down")
        self._retire(loop)
        self._down_since = now
        # a request that had started keeps that mark: recomputed elsewhere, it never times out in a queue
        specs = [replace(r.spec, started=True) if r.admitted_s is not None and not r.spec.started else r.spec
                 for r in taken]
        return sorted(specs, key=lambda s: (s.arrival_s, s.rid)), started

    def recover(self, env: simpy.Environment) -> bool:
        """One fault ends; True when the replica is up again (a fresh loop with an empty cache)."""
        self._down = max(0, self._down - 1)
        if self._down or self.loop is not None:
            return False
        self.down_s += env.now - self._down_since
        self.start(env)
        return True

    def finish(self, now: float) -> None:
        """End of the run: keep the last incarnation's results."""
        if self.loop is not None:
            self._retire(self.loop)
        else:
            self.down_s += now - self._down_since

    def _retire(self, loop: ServingLoop) -> None:
        self.records.append(loop.scheduler.records)
        self.outputs.update(loop.outputs)
        frame = loop.steps.frame()
        if len(frame):
            frame.insert(0, "incarnation", self.totals["incarnations"] - 1)
            self._frames.append(frame)
        st = loop.allocator.stats()
        self.totals["hit_tokens"] += st.hit_tokens
        self.totals["lookup_tokens"] += st.lookup_tokens
        self.totals["evictions"] += st.evictions
        self.totals["preemptions"] += loop.scheduler.preemptions
        for k in ALLOC_COUNTERS:
            self.alloc[k] = self.alloc.get(k, 0) + int(getattr(st, k))
        self.alloc["hot_capacity_end"] = int(st.pools["hot"].capacity) if "hot" in st.pools else 0
        self.loop = None
        self._proc = None

    def steps_frame(self) -> pd.DataFrame:
        if not self._frames:  # no step ran: the step log's columns alone
            frame = StepLog().frame()
            frame.insert(0, "incarnation", [])
            return frame
        return pd.concat(self._frames, ignore_index=True)
