"""Per-part step timing: CUDA events on a GPU (read once, after the step), wall clock on the CPU."""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class PartTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._spans: list[tuple[str, object, object]] = []

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    @contextmanager
    def part(self, key: str):
        a = self._mark()
        yield
        self._spans.append((key, a, self._mark()))

    def start(self):
        self._t0 = self._mark()

    def stop(self) -> tuple[float, dict[str, float]]:
        """(total seconds since start, seconds per key); synchronises the device."""
        t1 = self._mark()
        if self.cuda:
            t1.synchronize()
            secs = lambda a, b: a.elapsed_time(b) / 1e3  # noqa: E731
        else:
            secs = lambda a, b: b - a  # noqa: E731
        parts: dict[str, float] = {}
        for key, a, b in self._spans:
            parts[key] = parts.get(key, 0.0) + secs(a, b)
        return secs(self._t0, t1), parts
