"""Continuous-batching scheduler shared by the simulator and the real GPU engine.

No SimPy and no torch here: ``schedule(now)`` returns a frozen :class:`BatchPlan` (and
has already asked the allocator for every slot the plan writes); ``postprocess(plan,
result, now)`` consumes the executor's :class:`StepResult`.

Per step: (1) every decoding request gets one token — if memory is short, running
requests are preempted (recompute) in the configured order until it fits; (2) chunked
prefills in progress continue under the step's token budget; (3) waiting requests are
admitted first-come-first-served by radix match + capacity (the whole uncached prompt
plus a reserve for outstanding outputs must fit), skipping a request whose declared
shared prefix another request is prefilling right now (it will hit the cache instead of
computing a second copy); (4) decoding requests are grouped by their shared prefix and
each group gets an attention path. With ``admission = "prefix"`` (tenancy-aware), step
(3) first takes the waiting requests whose role prefix a running request holds (its
prefix is in the cache, locked), so that requests sharing a prefix are admitted together
and a prefix is computed once per wave instead of once per request when many tenants
compete for the cache; ``admission_max_wait_s`` puts older waiters first (no starvation).
Nothing is ever dropped: preempted requests return
to the front of the queue; only requests that can never fit, or that exceed a configured
queue limit, are rejected, with the reason recorded.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from granisim.kv.allocator import KVAllocator
from granisim.kv.reserve import LazyReserve
from granisim.core.batching import BatchBuilder, PathChooser, StepPricer
from granisim.core.contract import BatchPlan, StepResult
from granisim.core.decode_batch import DecodeBatch
from granisim.core.planned import columns
from granisim.core.request import Request, RequestRecords
from granisim.core.workload import RequestSpec


class Scheduler:
    def __init__(self, cfg, allocator: KVAllocator, *, group_size: int, m_sat: int,
                 dispatch: str = "threshold", path_chooser: PathChooser | None = None,
                 step_pricer: StepPricer | None = None, needs_layouts: bool = False):
        self.cfg = cfg
        self.alloc = allocator
        # groups decoding requests by prefix and picks each group's path (m_sat takes effect there)
        self.batch = BatchBuilder(allocator.policy, group_size, m_sat, dispatch, path_chooser, step_pricer,
                                  needs_layouts)
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # admission order
        # the running requests split by ``decoding``, each in running order (so that a plan needs no pass
        # over every running request to find them): kept by _admit, _preempt, _finish and postprocess; the
        # decoding ones take their plain decode steps together (DecodeBatch)
        self._decoding = DecodeBatch()
        self._prefilling: dict[int, Request] = {}
        self.records = RequestRecords()  # finished and rejected requests, as columns
        self.step_id = 0
        self._admitted = 0
        self._prefix_owner: dict[tuple[int, int], int] = {}  # (role, shared_len) -> rid prefilling it
        self.preemptions = 0
        self._decode_plan: tuple | None = None  # (plan, its requests, their ids) of the last decode-only plan
        self._plan_rows: tuple | None = None  # (the last plan's requests, its decoding requests: its first rows)
        # the pools' sizes move only with adaptive HOT: else their sum is fixed, kept for add()
        self._max_tokens = None if getattr(allocator, "adaptive", True) else sum(self._pool_sizes())

    # ---- arrivals and rejection -------------------------------------------------------------
    def add(self, spec: RequestSpec, now: float) -> None:
        need = spec.prompt_len + spec.output_len
        if need > self._max_request_tokens():
            self._reject(spec, now, f"needs {need} KV tokens; the {self.alloc.policy} budget holds "
                                    f"{self._max_request_tokens()} for one request")
        elif self.cfg.max_waiting and len(self.waiting) >= self.cfg.max_waiting:
            self._reject(spec, now, f"queue full ({self.cfg.max_waiting} waiting)")
        else:
            self.waiting.append(Request(spec))

    def _alone_reason(self, r: Request) -> str:
        """Why ``r`` does not fit even an empty cache: its KV tokens against the pools (granikv's HOT pool holds
        shared prefixes only, so a request without one has the COLD pool alone)."""
        cold, hot = self._pool_sizes()
        pools = f"COLD holds {cold}, HOT {hot} for shared prefixes only" if hot else f"the pool holds {cold}"
        return (f"does not fit the {self.alloc.policy} KV budget even alone ({r.spec.prompt_len + r.spec.output_len} "
                f"KV tokens, {r.spec.shared_len} of them a shared prefix; {pools})")

    def _pool_sizes(self) -> tuple[int, int]:
        """(COLD / token pool, HOT pool) capacity in tokens; HOT is 0 without one."""
        return self.alloc.store.capacity, self.alloc.hot.capacity if self.alloc.hot is not None else 0

    def _max_request_tokens(self) -> int:
        if self._max_tokens is not None:
            return self._max_tokens
        return sum(self._pool_sizes())

    def expire(self, now: float) -> None:
        """Reject requests that waited longer than ``queue_timeout_s`` without ever starting (here, or on a
        fleet replica that handed them back: ``spec.started``)."""
        t = self.cfg.queue_timeout_s
        if not t:
            return
        keep = deque()
        for r in self.waiting:
            if _never_started(r) and now - r.spec.arrival_s > t:
                self._reject(r.spec, now, f"waited over queue_timeout_s={t}")
            else:
                keep.append(r)
        self.waiting = keep

    def next_expiry(self) -> float | None:
        t = self.cfg.queue_timeout_s
        if not t:
            return None
        times = [r.spec.arrival_s + t for r in self.waiting if _never_started(r)]
        return min(times) if times else None

    def _reject(self, spec: RequestSpec, now: float, reason: str) -> None:
        self.records.add_rejected(spec, now, reason)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- planning ------------------------------------------------------------------------------
    def schedule(self, now: float) -> BatchPlan | None:
        alloc, cfg = self.alloc, self.cfg
        alloc.rebalance()  # adaptive HOT moves its boundary here, between plans (else a no-op)
        work: list[tuple[Request, int, np.ndarray]] = []  # the rows after the decode rows
        # (1) decodes: one token each, preempting until they all fit
        decode, rids = self._decoding.members()  # read-only lists
        while decode and not alloc.can_grow(rids, 1):
            self._preempt(self._victim())  # a victim that was decoding leaves _decoding
            decode, rids = self._decoding.members()
        decode_slots = None
        if self.batch.needs_layouts:  # the executor writes K/V: it needs the slot ids
            decode_slots = alloc.extend_all(rids, 1)
        elif decode:
            alloc.grow_tracked(rids, 1)  # the decoding requests are the allocator's tracked ones
        budget = cfg.max_batch_tokens - len(decode)
        slots = self.batch.needs_layouts  # only an executor that writes K/V reads a row's slot ids
        # (2) chunked prefills in progress
        for r in list(self._prefilling.values()) if self._prefilling else ():
            if budget <= 0:
                break
            n = min(r.n_tokens - r.computed, budget)
            if alloc.can_extend({r.rid: n}):
                work.append((r, n, alloc.extend(r.rid, n, slots)))
                budget -= n
        # (3) admissions
        if cfg.admission == "prefix" and len(self.waiting) > 1:
            self._group_by_prefix(now)
        skipped: list[Request] = []
        reserve = self._reserve() if self.waiting else 0
        while self.waiting and budget > 0 and len(self.running) < cfg.max_running:
            r = self.waiting.popleft()
            key = (r.spec.role, r.spec.shared_len)
            if r.spec.shared_len and key in self._prefix_owner:
                skipped.append(r)
                continue
            if not self._admit(r, now, reserve):
                if not self.running:  # it does not fit even into an empty cache
                    self._reject(r.spec, now, self._alone_reason(r))
                    continue
                self.waiting.appendleft(r)
                break
            n = min(r.n_tokens - r.computed, budget)
            work.append((r, n, alloc.extend(r.rid, n, slots)))
            budget -= n
            reserve = reserve.plus(self._reserve_of(r) - n)
        if skipped:
            self.waiting.extendleft(reversed(skipped))
        if not work and not decode:
            if self.running:  # every running request is blocked: free memory for the oldest
                self._preempt(self._victim())
                return self.schedule(now)
            return None
        self.step_id += 1
        batch = self._decoding
        plan = self.batch.build(work, alloc, self.step_id, decode=decode, rids=rids, decode_slots=decode_slots,
                                ctx=batch.contexts() if decode and not self.batch.needs_layouts else None,
                                any_group=batch.any_group)
        # a decode-only plan: fast_forward_limit / extend_plan reuse its requests and ids
        self._decode_plan = (plan, decode, rids) if not work else None
        self._plan_rows = (plan.requests, decode)
        return plan

    def _group_by_prefix(self, now: float) -> None:
        """Tenancy-aware order: aged waiters, then those whose role prefix is held by a running
        request (a cache hit), then the rest; first come first served within each class."""
        warm = {q.spec.role for q in self.running.values() if q.spec.shared_len}
        max_wait = self.cfg.admission_max_wait_s

        def cls(r: Request) -> int:
            if max_wait and now - r.spec.arrival_s > max_wait:
                return 0
            return 1 if r.spec.shared_len and r.spec.role in warm else 2

        self.waiting = deque(sorted(self.waiting, key=cls))  # stable: keeps arrival order per class

    def _reserve_of(self, q: Request) -> int:
        """Tokens a running request may still claim: its unfinished prompt + a share of its outputs."""
        return int(self.cfg.new_token_ratio * q.remaining_output) + (q.n_tokens - q.computed)

    def _reserve(self) -> LazyReserve:
        """``sum(self._reserve_of(q) for q in self.running.values())`` as a LazyReserve: an upper bound from
        the decode batch's sums, the exact sum (its arrays) only if an admission asks for it."""
        ratio = self.cfg.new_token_ratio
        others = self._others_outstanding()
        return LazyReserve(self._decoding.outstanding_bound(ratio) + others,
                           lambda: self._decoding.outstanding(ratio) + others)

    def _others_outstanding(self) -> int:
        """``_reserve_of`` summed over the running requests off the decode clock (prefilling ones, and
        decoding ones that cache their prefix)."""
        ratio = self.cfg.new_token_ratio
        others = [*self._prefilling.values(), *self._decoding.special.values()]
        return sum([int(ratio * (q.output_len - q.generated)) + (q.n_tokens - q.computed) for q in others])

    def _admit(self, r: Request, now: float, outstanding: LazyReserve) -> bool:
        alloc, spec = self.alloc, r.spec
        shared = spec.shared_len
        tokens = r.tokens[: r.n_tokens]
        prefix = spec.prefix  # the prompt starts with it: its role's cached nodes need no second look
        reserve = outstanding.plus(int(self.cfg.new_token_ratio * r.remaining_output))
        if not alloc.can_admit(tokens, shared, reserve, prefix):
            if not self.running and not alloc.can_admit(tokens, shared, 0, prefix):
                # nothing running and it still does not fit: the cache must give way (and adaptive HOT its
                # free space, which it keeps for the recent prefix demand)
                alloc.clear_cache()
                alloc.give_back_hot()
                if not alloc.can_admit(tokens, shared, 0, prefix):
                    return False
            elif self.running:
                return False
        computed = r.computed = alloc.admit(r.rid, tokens, shared, prefix, checked=True)
        r.group = alloc.prefix_group(r.rid)  # changes only when its prefix is cached (postprocess)
        if r.admitted_s is None:
            r.admitted_s = now
            r.cached_at_admit = computed
        r.admit_order = self._admitted
        self._admitted += 1
        r.prefix_cached = shared > 0 and computed >= shared
        # others of its role wait for it only while it computes what the cache will hold of the prefix: whole
        # pages (a paged policy never caches a partial page, so waiting for more would gain nothing)
        shareable = shared - shared % alloc.page_size
        if computed < shareable:
            self._prefix_owner[(spec.role, shared)] = r.rid
        self.running[r.rid] = r
        self._prefilling[r.rid] = r  # its admit_order is the largest: the end of running order
        return True

    def _victim(self) -> Request:
        rs = list(self.running.values())
        if self.cfg.preempt_order == "lifo":
            return max(rs, key=lambda q: q.admit_order)
        # SGLang's retract order: fewest generated tokens first, then the longest prompt
        return min(rs, key=lambda q: (q.generated, -q.prompt_len, -q.admit_order))

    def _preempt(self, r: Request) -> None:
        self.alloc.release(r.rid)
        del self.running[r.rid]
        if r.decoding:
            self._decoding.leave(r)
        else:
            del self._prefilling[r.rid]
        key = (r.spec.role, r.spec.shared_len)
        if self._prefix_owner.get(key) == r.rid:
            del self._prefix_owner[key]
        r.computed = 0
        r.decoding = False
        r.prefix_cached = False
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    # ---- decode fast-forward ----------------------------------------------------------------
    def fast_forward_limit(self, plan: BatchPlan) -> int:
        """How many identical decode steps ``plan`` may stand for (1 = no fast-forward).

        Exact because nothing can change the batch in between: no prefill, no admission
        possible (schedule() just tried), no request finishes before the last step, and
        the memory for every step is there without preemption.
        """
        if not self.cfg.fast_forward:
            return 1
        last = self._decode_plan
        if last is not None and last[0] is plan:  # every decoding request, one token each
            rids = last[2]
            k = self._decoding.min_remaining()
        else:
            cols = columns(plan.requests)
            if True in cols.is_prefill:
                return 1
            rids = cols.rid
            k = min([self.running[rid].remaining_output for rid in rids])
        k = min(k, max(1, self.alloc.available() // max(1, len(rids)) - self.alloc.page_size))
        while k > 1 and not self.alloc.can_grow(rids, k - 1):
            k //= 2
        return max(1, k)

    def extend_plan(self, plan: BatchPlan, steps: int) -> None:
        """Allocate the K/V slots of steps 2..``steps`` of a fast-forwarded decode plan."""
        last = self._decode_plan
        mine = last is not None and last[0] is plan  # its rows are every decoding request
        rids = last[2] if mine else columns(plan.requests).rid
        if self.batch.needs_layouts:
            self.alloc.extend_all(rids, steps - 1)
        elif mine:
            self.alloc.grow_tracked(rids, steps - 1)
        else:
            self.alloc.grow(rids, steps - 1)

    # ---- results -----------------------------------------------------------------------------
    def postprocess(self, plan: BatchPlan, result: StepResult, now: float, steps: int = 1) -> list[Request]:
        """Apply a step's results; returns the requests that finished."""
        done = []
        real = result.next_tokens if steps == 1 else None  # None: stand-in tokens (Request.advance)
        cols = columns(plan.requests)
        rids, num_new = cols.rid, cols.num_new
        last = self._plan_rows
        if real is None and last is not None and last[0] is plan.requests:
            # this scheduler's last plan: its first rows are the decoding requests, one token each: those
            # on the clock take their steps at once; the special ones and the finishers, in running order
            decode, batch = last[1], self._decoding
            special = list(batch.special.values()) if batch.special else None
            due = batch.advance(steps)
            if special:
                due = sorted(due + special, key=_admit_order)
            for r in due:
                if r._clock is None:  # special: the step also caches its prefix
                    self._apply(r, 1, steps, None, now, done)
                else:
                    self._finish(r, now)
                    done.append(r)
            if len(decode) == len(rids):
                return done
            rows = zip(rids[len(decode):], num_new[len(decode):])  # prefill rows: none is decoding
            stepped = False
        else:
            rows = zip(rids, num_new)
            stepped = True
        running = self.running
        for rid, n in rows:
            r = running[rid]
            if r.decoding and (r.prefix_cached or not r.spec.shared_len):  # a decode step: nothing else changes
                r.computed += steps
                if real is None:  # r.advance(steps), inlined
                    r.n_tokens += steps
                    r.generated += steps
                else:
                    r.append_one(int(real[r.rid]))
                if r.generated >= r.output_len:
                    self._finish(r, now)
                    done.append(r)
                continue
            self._apply(r, n, steps, real, now, done)
        if stepped and self._decoding:  # decoding requests' counters changed one by one
            self._decoding.rebuild()
        return done

    def _apply(self, r: Request, num_new: int, steps: int, real, now: float, done: list[Request]) -> None:
        """A plan's row of ``r`` other than a plain decode step: a prefill chunk (perhaps the prompt's
        last, which samples the first token), or a decode step that caches the declared prefix."""
        r.computed += num_new
        sampled = r.computed >= r.n_tokens  # else a mid-prompt chunk
        r.computed += steps - 1  # fast-forward: decode only, one token per step
        if r.spec.shared_len and not r.prefix_cached and r.computed >= r.spec.shared_len:
            self.alloc.cache_prefix(r.rid, r.tokens[: r.spec.shared_len])
            r.group = self.alloc.prefix_group(r.rid)
            r.prefix_cached = True
            key = (r.spec.role, r.spec.shared_len)
            if self._prefix_owner.get(key) == r.rid:
                del self._prefix_owner[key]
        if not sampled:
            return
        if real is None:
            r.advance(steps)
        else:
            r.append_one(int(real[r.rid]))
        if not r.decoding:
            r.decoding = True
            self._start_decoding(r)
        if r.first_token_s is None:
            r.first_token_s = now
        if r.generated >= r.output_len:
            self._finish(r, now)
            done.append(r)
        elif r.prefix_cached and r.rid in self._decoding.special:  # its prefix is cached: on the clock now
            self._decoding.promote(r)

    def _start_decoding(self, r: Request) -> None:
        """Move ``r`` (its ``decoding`` just set) from _prefilling to _decoding, keeping running order."""
        del self._prefilling[r.rid]
        self._decoding.join(r)
        if not self.batch.needs_layouts:  # its decode slots are counted with the others' (grow_tracked)
            self.alloc.track(r.rid)

    def _finish(self, r: Request, now: float) -> None:
        self._decoding.leave(r)  # a request finishes decoding
        # its buffer is written once per position and never after it finishes: the index may keep views of it
        self.alloc.release(r.rid, r.tokens[: r.computed], fixed=True)
        del self.running[r.rid]
        self.records.add_completed(r.spec, r, now)


def _never_started(r: Request) -> bool:
    """Not yet admitted, here or on a fleet replica that handed it back (``spec.started``): a queue timeout holds."""
    return r.admitted_s is None and not r.spec.started


def _admit_order(r: Request) -> int:
    return r.admit_order
