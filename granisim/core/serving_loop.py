"""The engine loop (SimPy): one process plans and executes steps, arrivals feed the queue.

    plan = scheduler.schedule(now)          # allocator + radix index decide
    result = executor.execute(plan)         # predicted (cost model) or measured (GPU) seconds
    yield env.timeout(result.duration_s)    # the clock advances by the step's duration
    scheduler.postprocess(plan, result, now)

Event ordering at equal times: arrivals are scheduled with SimPy's URGENT priority, so a
request arriving exactly when a step ends is already queued when the next step is
planned; a request arriving during a step waits for that step's end. Otherwise SimPy fires
events in time order and, at equal time and priority, in creation order — so the same
scenario and seed give identical results.

Decode fast-forward (executors with ``max_steps_per_plan > 1``): when a step is decode
only and nothing can change the batch before its end, the engine lets one plan stand for
k identical steps, stopping at the step boundary at or after the next arrival or queue
expiry. The results equal stepping one at a time.

As a fleet replica (``feed`` given; :mod:`granisim.fleet`): the loop runs as one process
in a shared environment (:meth:`start`), requests come from the router (:meth:`submit`),
finished requests go back to the feed (which makes and routes follow-up turns), and a
fast-forward block stops at the feed's next event (any arrival may be routed here).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import simpy
from simpy.core import URGENT

from granisim.kv.allocator import make_allocator
from granisim.kv.host_tier import host_tier_config
from granisim.core.metrics import StepLog
from granisim.core.progress import NoBar, request_bar
from granisim.core.contract import Executor, with_steps
from granisim.core.request import JoinedRecords, RequestRecords, unsent_turns
from granisim.core.scheduler import Scheduler
from granisim.core.workload import ArrivalQueue, InitialSpecs, Workload


@dataclass
class SimResult:
    records: RequestRecords | JoinedRecords  # a fleet's: its replicas' records joined
    steps: StepLog
    end_s: float
    info: dict = field(default_factory=dict)


_ARRIVAL = "arrival"  # the cause of a fleet replica's interrupt when a request is routed to it mid-block


class PendingTimes:
    """A multiset of times: the arrival times not yet delivered. ``first()`` is the smallest,
    ``pop()`` removes the smallest. One sorted array (the initial arrivals) is read behind a
    cursor instead of being pushed one float at a time; other times go into a heap."""

    __slots__ = ("_heap", "_sorted", "_next")

    def __init__(self):
        self._heap: list[float] = []
        self._sorted: np.ndarray | None = None
        self._next = 0

    def can_take_sorted(self) -> bool:
        return self._sorted is None or self._next >= len(self._sorted)

    def take_sorted(self, times: np.ndarray) -> None:
        """Add non-decreasing ``times``."""
        self._sorted, self._next = times, 0

    def push(self, t: float) -> None:
        heapq.heappush(self._heap, t)

    def _sorted_first(self) -> bool:
        srt = self._sorted
        if srt is None or self._next >= len(srt):
            return False
        return not self._heap or float(srt[self._next]) <= self._heap[0]

    def first(self) -> float:
        if self._sorted_first():
            return float(self._sorted[self._next])
        return self._heap[0]

    def pop(self) -> float:
        if self._sorted_first():
            self._next += 1
            return float(self._sorted[self._next - 1])
        return heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap) + (len(self._sorted) - self._next if self._sorted is not None else 0)


class UrgentTimeout(simpy.Event):
    """A timeout processed before every NORMAL event of the same time. Built the way SimPy builds its own
    ``simpy.Timeout`` (an ``Event`` subclass born triggered, scheduled at a delay), with URGENT priority."""

    def __init__(self, env: simpy.Environment, delay: float, value=None):
        super().__init__(env)
        self._ok, self._value = True, value  # the Event protocol's "triggered and ok" state, as Timeout sets it
        env.schedule(self, URGENT, delay)


class ServingLoop:
    def __init__(self, setup, executor: Executor, *, progress: bool = True, keep_outputs: bool = False,
                 feed=None):
        self.setup = setup
        self.keep_outputs = keep_outputs  # rid -> generated token ids (for correctness checks)
        self.outputs: dict[int, np.ndarray] = {}
        self.executor = executor
        self.progress = progress
        s = setup.scenario
        host = host_tier_config(s, setup.model)
        # COLD slot ids are read only by an executor that writes K/V and by a host tier's transfers
        self.allocator = make_allocator(s.policy.name, setup.kv_budget, hot_fraction=s.policy.hot_fraction,
                                        page_size=s.policy.page_size, host=host,
                                        slot_ids=executor.needs_layouts or host is not None)
        self.scheduler = Scheduler(s.scheduler, self.allocator, group_size=setup.model.group_size,
                                   m_sat=setup.m_sat, dispatch=s.policy.dispatch, path_chooser=setup.path_chooser,
                                   step_pricer=setup.step_pricer, needs_layouts=executor.needs_layouts)
        # fleet replica: feed.finished(request, outputs, now)
        self.feed = feed
        self.workload = Workload(s.workload, s.seed, setup.trace, setup.model.vocab) if feed is None else None
        self.steps = StepLog()
        self._pending = PendingTimes()  # arrival times scheduled but not yet delivered
        self._wake: simpy.Event | None = None
        self._proc: simpy.Process | None = None
        self._in_block = False  # fleet replica: a fast-forward block is running (an arrival cuts it)

    def run(self) -> SimResult:
        env = self.env = simpy.Environment()
        initial = self.workload.initial_specs()
        self._bar = request_bar(len(initial), self.progress)
        self._add_arrivals(initial)
        del initial  # the arrival queue builds each spec when it comes up, a running request holds it until it ends
        env.process(self._engine())
        env.run()
        self._bar.close()
        records = self.scheduler.records
        for r in unsent_turns(records, self.workload):
            records.append(r)
        return SimResult(records, self.steps, env.now,
                         dict(kv_budget=self.setup.kv_budget, preemptions=self.scheduler.preemptions))

    def start(self, env: simpy.Environment) -> simpy.Process:
        """Fleet replica: run the engine as one process of a shared environment."""
        self.env = env
        self._bar = NoBar()
        self._proc = env.process(self._replica_engine())
        return self._proc

    def _replica_engine(self):
        try:
            yield from self._engine()
        except simpy.Interrupt:  # the replica went down: the fleet has taken its requests back
            return

    def submit(self, spec) -> None:
        """Queue a request now and wake the engine if it is idle."""
        self.scheduler.add(spec, self.env.now)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        if self._in_block:  # fleet replica: end the block at the first step boundary from now
            self._in_block = False
            self._proc.interrupt(_ARRIVAL)

    # ---- processes ------------------------------------------------------------------------
    def _add_arrivals(self, specs) -> None:
        # counted as pending at once, so the engine never stops while one is on its way
        if isinstance(specs, InitialSpecs) and specs.in_order() and self._pending.can_take_sorted():
            self._pending.take_sorted(specs.times)
        else:
            for s in specs:
                self._pending.push(s.arrival_s)
        self.env.process(self._arrivals(ArrivalQueue(specs)))

    def _arrivals(self, queue: ArrivalQueue):
        """Deliver requests at their arrival times (URGENT: before a step ending then is planned)."""
        while len(queue):
            spec = queue.pop()
            yield UrgentTimeout(self.env, max(0.0, spec.arrival_s - self.env.now))
            self._pending.pop()
            self.submit(spec)

    def _engine(self):
        env, sched, ex, feed = self.env, self.scheduler, self.executor, self.feed
        n_done = 0
        counting = not isinstance(self._bar, NoBar)  # only a shown bar reads how many have finished
        while True:
            now = env.now
            sched.expire(now)
            plan = sched.schedule(now)
            if plan is None:
                if not self._pending and not sched.has_work:
                    if feed is None:
                        break
                    feed.idle()  # a fleet replica: the fleet may have no work left anywhere
                self._idle_until_next_arrival()
                self._wake = env.event()
                yield self._wake
                continue
            steps = min(sched.fast_forward_limit(plan), ex.max_steps_per_plan) if ex.max_steps_per_plan > 1 else 1
            result = None
            if steps > 1:
                whole = with_steps(plan, steps)  # the plan standing for the whole block (kept if it runs whole)
                block = ex.execute(whole)
                cut = self._steps_until_event(block.step_durations, steps)
                result = block if cut == steps else None  # cut short by an event: its first steps (executor)
                steps = cut
            start = now
            if steps > 1 and result is not None and feed is not None:
                # fleet replica: wait out the block unless a request is routed here first; then stop at the
                # first step boundary at or after its arrival, as the single loop does for an arrival it knows
                # in advance. The block's extra K/V slots are allocated after it, for the steps that ran
                self._in_block = True
                try:
                    yield env.timeout(result.duration_s)
                    routed = False
                except simpy.Interrupt as stop:
                    if stop.cause != _ARRIVAL:
                        raise
                    routed = True
                finally:
                    self._in_block = False
                ran = whole  # the plan standing for the steps that ran
                if routed:
                    k = _first_boundary(result.step_durations, env.now - start, steps)
                    if k != steps:
                        ran = with_steps(plan, k)
                        result = ex.execute(ran)
                    yield env.timeout(max(0.0, start + result.duration_s - env.now))
                    steps = k
                if steps > 1:
                    sched.extend_plan(plan, steps)
                    plan = ran
            else:
                if steps > 1:
                    sched.extend_plan(plan, steps)
                    plan = whole if steps == whole.num_steps else with_steps(plan, steps)
                result = result or ex.execute(plan)
                yield env.timeout(result.duration_s)
            done = sched.postprocess(plan, result, env.now, steps)
            self.steps.record(start, plan, result, self.allocator)
            for r in done:
                if self.keep_outputs:
                    self.outputs[r.rid] = r.tokens[r.prompt_len : r.n_tokens].copy()
                if self.feed is not None:
                    self.feed.finished(r, r.tokens[r.prompt_len : r.n_tokens], env.now)
                    continue
                nxt = self.workload.follow_up(r.spec, r.tokens[r.prompt_len : r.n_tokens], env.now)
                if nxt is not None:
                    self._bar.total += 1
                    self._add_arrivals([nxt])
            if counting:
                n_finished = len(sched.records)
                if n_finished != n_done:
                    self._bar.update(n_finished - n_done)
                    n_done = n_finished

    def _idle_until_next_arrival(self) -> None:
        """An executor with an ``idle(seconds)`` method (the GPU executor) is told the gap until the next
        arrival, so a measured run idles as a server would; the simulated clock is unchanged. Single-GPU
        loop only (a fleet replica's next request depends on the router)."""
        idle = getattr(self.executor, "idle", None)
        if idle is not None and self.feed is None and self._pending:
            gap = self._pending.first() - self.env.now
            if gap > 0:
                idle(gap)

    def _steps_until_event(self, durations, k: int) -> int:
        """Steps to run so that the block ends at the first step boundary at or after the next event
        (a fleet replica learns of its arrivals only when they are routed: see _engine)."""
        arrival = None if self.feed is not None else (self._pending.first() if self._pending else None)
        nxt = [t for t in (arrival, self.scheduler.next_expiry()) if t is not None]
        if not nxt:
            return k
        return _first_boundary(durations, min(nxt) - self.env.now, k)


def _first_boundary(durations, gap: float, k: int) -> int:
    """Steps of a block (at most ``k``) up to the first step boundary at or after ``gap`` seconds from its
    start: ``min(k, np.searchsorted(np.cumsum(durations), gap, side="left") + 1)``, summed left to right as
    np.cumsum does and stopping there (a block is cut after a few of its steps, so this is cheaper than
    building the array)."""
    elapsed = 0.0
    for i, d in enumerate(durations):
        elapsed += d
        if elapsed >= gap:
            return min(k, i + 1)
    return k
