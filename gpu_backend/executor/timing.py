"""Per-part step timing by boundary marks: `switch(key)` closes the running part and opens `key`.

On a GPU the marks are CUDA events, read once after the step; created with ``external=True``
they are captured into a CUDA graph as event-record nodes and re-recorded by every replay,
so one timer per captured graph times every replay of it. On the CPU: wall clock.
"""
from __future__ import annotations

import contextlib
import gc
import time

import torch


class PartTimer:
    def __init__(self, device: torch.device, *, in_graph: bool = False, enabled: bool = True):
        self.cuda = device.type == "cuda"
        self.in_graph = in_graph
        self.enabled = enabled
        self._marks: list[tuple[str | None, object]] = []  # (part opened here, mark)

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True, external=self.in_graph)
            ev.record()
            return ev
        return time.perf_counter()

    def switch(self, key: str | None) -> None:
        """Close the running part and open `key` (None: stop timing)."""
        if self.enabled and (not self._marks or self._marks[-1][0] != key):
            self._marks.append((key, self.mark()))

    def parts(self) -> dict[str, float]:
        """Seconds per key; the device must have finished the marked work."""
        out: dict[str, float] = {}
        for (key, a), (_, b) in zip(self._marks, self._marks[1:]):
            if key is not None:
                out[key] = out.get(key, 0.0) + elapsed(a, b)
        return out


def elapsed(a, b) -> float:
    return a.elapsed_time(b) / 1e3 if isinstance(a, torch.cuda.Event) else b - a


class CompileWatch:
    """Counts Triton kernel builds and loads in this process (knobs.runtime.jit_post_compile_hook).

    A step whose launches built or loaded a kernel variant spent host time on it that no later
    step pays; the executor re-runs such a step and times the re-run (see executor.py)."""

    count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        try:
            from triton import knobs
        except ImportError:  # older triton: no hooks, no re-runs
            return
        previous = knobs.runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            cls.count += 1
            return previous(*args, **kwargs) if previous else None

        knobs.runtime.jit_post_compile_hook = hook
        cls._installed = True


class GcWatch:
    """Python's cyclic garbage collections in this process (gc.callbacks): count, seconds, the
    longest, and how many ran inside a timed step.

    A collection walks the whole process's heap (the engine's requests, records and, when
    validating, every stored plan), so its pause grows with the run and is not the step's work.
    The executor holds collections off while it times a step (`hold`); one that falls due then
    runs at the first allocation after the step, outside the clock, like the scheduler's own
    host time."""

    totals = dict(gc_collections=0, gc_s=0.0, gc_max_s=0.0, gc_in_steps=0)
    _started: float | None = None
    _stepping = False
    _installed = False

    @classmethod
    def install(cls) -> None:
        if not cls._installed:
            gc.callbacks.append(cls._callback)
            cls._installed = True

    @classmethod
    def _callback(cls, phase: str, info: dict) -> None:
        if phase == "start":
            cls._started = time.perf_counter()
        elif cls._started is not None:
            dt, cls._started = time.perf_counter() - cls._started, None
            t = cls.totals
            t["gc_collections"] += 1
            t["gc_s"] += dt
            t["gc_max_s"] = max(t["gc_max_s"], dt)
            t["gc_in_steps"] += cls._stepping

    @classmethod
    @contextlib.contextmanager
    def hold(cls, enabled: bool):
        """One timed step: collections are off inside it when `enabled`."""
        was = gc.isenabled()
        if enabled:
            gc.disable()
        cls._stepping = True
        try:
            yield
        finally:
            cls._stepping = False
            if was:
                gc.enable()

    @classmethod
    def since(cls, start: dict) -> dict:
        """Totals since the snapshot `start` (a copy of `totals`); the longest pause is the process's."""
        return {k: (round(v, 4) if k == "gc_max_s" else round(v - start[k], 4)) for k, v in cls.totals.items()}


class AllocWatch:
    """Device allocations the CUDA caching allocator made inside steps (cudaMalloc calls, and retries after
    freeing its cache: both stall the host), counted per step from torch.cuda.memory_stats (read outside
    the step's clock). Eager steps allocate their activations; graph replays allocate nothing. Off by
    default (GpuExecutor(watch_allocs=True) turns it on): it adds host time between steps."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.cuda = enabled and device.type == "cuda"
        self.steps_with_allocs: list[int] = []
        self.mallocs = self.retries = 0

    def _counts(self) -> tuple[int, int]:
        m = torch.cuda.memory_stats()
        return m.get("num_device_alloc", 0), m.get("num_alloc_retries", 0)

    @contextlib.contextmanager
    def step(self, step_id: int):
        if not self.cuda:
            yield
            return
        a0, r0 = self._counts()
        try:
            yield
        finally:
            a1, r1 = self._counts()
            if a1 != a0 or r1 != r0:
                self.steps_with_allocs.append(step_id)
            self.mallocs += a1 - a0
            self.retries += r1 - r0

    def stats(self) -> dict:
        if not self.cuda:
            return {}
        return dict(step_mallocs=self.mallocs, step_alloc_retries=self.retries,
                    steps_with_allocs=len(self.steps_with_allocs), alloc_steps=list(self.steps_with_allocs))
