"""Per-part step timing by boundary marks: `switch(key)` closes the running part and opens `key`.

On a GPU the marks are CUDA events, read once after the step; created with ``external=True``
they are captured into a CUDA graph as event-record nodes and re-recorded by every replay,
so one timer per captured graph times every replay of it. On the CPU: wall clock.
"""
from __future__ import annotations

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
