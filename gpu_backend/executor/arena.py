"""Device buffers a step's metadata is copied into, at addresses that depend only on its shape.

A CUDA graph replays its launches with the pointers it captured, so the metadata of every
step must land at the same addresses as at capture: the fixed-size fields go one after the
other into one buffer (their sizes, hence offsets, follow from the `StepShape`), and each
variable-length index list into its own buffer whose whole length is handed to the kernels
(they read only the prefix the CSR pointers name). Buffers grow by doubling (`reserve`, a
one-off the executor keeps off the step's clock, like a graph capture); a growth bumps
`generation`, which retires every captured graph. One pinned staging copy and one
host-to-device copy per field per step.
"""
from __future__ import annotations

import numpy as np
import torch

from .rows import HostStep


class MetaArena:
    def __init__(self, device: torch.device):
        self.device = device
        self.generation = 0
        self.growths = 0
        self._dev: dict[str, torch.Tensor] = {}
        self._host: dict[str, torch.Tensor] = {}

    @staticmethod
    def _sizes(step: HostStep) -> dict[str, int]:
        return {"small": sum(a.size for a in step.small), **{name: a.size for name, a in step.big.items()}}

    def _short(self, step: HostStep) -> dict[str, int]:
        """The buffers `step` needs that are missing or too small, with the sizes it needs."""
        return {name: n for name, n in self._sizes(step).items()
                if name not in self._dev or self._dev[name].numel() < n}

    def fits(self, step: HostStep) -> bool:
        """Whether every buffer `step` needs is already large enough (no allocation in `upload`)."""
        return not self._short(step)

    def reserve(self, step: HostStep) -> None:
        """Grow the buffers `step` needs (device and pinned host allocations)."""
        for name, n in self._short(step).items():
            self._grow(name, n)

    def _grow(self, name: str, n: int) -> None:
        cap = max(1024, 1 << max(n - 1, 1).bit_length())
        self._dev[name] = torch.zeros(cap, dtype=torch.int32, device=self.device)
        self._host[name] = torch.zeros(cap, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        self.generation += 1
        self.growths += 1

    def _put(self, name: str, a: np.ndarray) -> torch.Tensor:
        dev, host = self._dev[name], self._host[name]
        if a.size:
            host[: a.size].numpy()[:] = a
            dev[: a.size].copy_(host[: a.size], non_blocking=True)
        return dev

    def upload(self, step: HostStep) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """(views of the fixed-size fields in order, whole buffer of each variable-length field); the
        buffers must fit `step` (`reserve` first)."""
        flat = np.concatenate(step.small)
        dev = self._put("small", flat)
        views, at = [], 0
        for a in step.small:
            views.append(dev[at: at + a.size])
            at += a.size
        return views, {name: self._put(name, a) for name, a in step.big.items()}
