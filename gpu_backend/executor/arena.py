"""Device buffers a step's metadata is copied into, at addresses that depend only on its shape.

A CUDA graph replays its launches with the pointers it captured, so the metadata of every
step must land at the same addresses as at capture: the fixed-size fields go one after the
other into one buffer (their sizes, hence offsets, follow from the `StepShape`), and each
variable-length index list into its own buffer whose whole length is handed to the kernels
(they read only the prefix the CSR pointers name). Buffers grow by doubling (`reserve`, a
one-off the executor keeps off the step's clock, like a graph capture); a growth bumps
`generation`, which retires every captured graph. Per step: the fixed-size fields concatenated
straight into their pinned staging buffer, each non-empty index list copied into its own, and one
host-to-device copy per non-empty buffer; a CUDA-graph step's copy of the fixed-size fields is the graph's first
node (`copy_small`), so the host only stages them. What a step's launches read the buffers through (the
views of its fields, metadata.StepMeta) depends only on its shape and the generation, so it is made
once per shape and generation and kept in `memo` (a graph replay reads none of it).

One buffer is not a step's: the request table (request_table.py), which the steps write on the device and
read from step to step. It grows like the others, keeping what it holds.
"""
from __future__ import annotations

import numpy as np
import torch

from .rows import HostStep

MEMO_SPANS = 1024  # (buffer, length) pairs whose copy views an arena keeps


class MetaArena:
    def __init__(self, device: torch.device):
        self.device = device
        self.generation = 0
        self.growths = 0
        self._dev: dict[str, torch.Tensor] = {}
        self._host: dict[str, torch.Tensor] = {}
        self._host_np: dict[str, np.ndarray] = {}  # numpy views of the pinned buffers
        self._cap: dict[str, int] = {}  # each buffer's length (ints: `fits` runs every step)
        # (buffer, length) -> the (device, pinned) views a copy of that length goes between: slicing a tensor costs a
        # few us of Python a call, and the fixed-size fields of a step shape are copied at one length step after step
        self._spans: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.memo: dict = {}  # StepShape -> what metadata.upload made of this generation's buffers

    @staticmethod
    def _sizes(step: HostStep) -> dict[str, int]:
        sizes = {"small": step.small_ids, **{name: a.size for name, a in step.big.items()}}
        if step.table_entries:
            sizes["table"] = step.table_entries
        return sizes

    def _short(self, step: HostStep) -> dict[str, int]:
        """The buffers `step` needs that are missing or too small, with the sizes it needs."""
        cap = self._cap
        return {name: n for name, n in self._sizes(step).items() if cap.get(name, -1) < n}

    def fits(self, step: HostStep) -> bool:
        """Whether every buffer `step` needs is already large enough (no allocation in `upload`)."""
        return not self._short(step)

    def reserve(self, step: HostStep) -> None:
        """Grow the buffers `step` needs (device and pinned host allocations)."""
        for name, n in self._short(step).items():
            self._grow(name, n)

    def _grow(self, name: str, n: int) -> None:
        cap = max(1024, 1 << max(n - 1, 1).bit_length())
        old = self._dev.get(name)
        self._dev[name] = torch.zeros(cap, dtype=torch.int32, device=self.device)
        if name == "table":  # written on the device only: its rows are kept, no host staging
            if old is not None:
                self._dev[name][: old.numel()] = old
        else:
            self._host[name] = torch.zeros(cap, dtype=torch.int32, pin_memory=self.device.type == "cuda")
            self._host_np[name] = self._host[name].numpy()
        self._cap[name] = cap
        self._spans.clear()
        self.memo.clear()
        self.generation += 1
        self.growths += 1

    def _copy(self, name: str, n: int) -> None:
        """The first `n` staged ids of buffer `name` to the device (after the pinned copy is written)."""
        if not n:
            return
        span = self._spans.get((name, n))
        if span is None:
            if len(self._spans) >= MEMO_SPANS:  # index lists' lengths vary without bound
                self._spans.clear()
            span = self._spans[name, n] = (self._dev[name][:n], self._host[name][:n])
        span[0].copy_(span[1], non_blocking=True)

    def upload(self, step: HostStep, small_later: bool = False) -> None:
        """Copy the step's fields into the buffers (which must fit it: `reserve` first). `small_later`: the
        fixed-size fields are only staged; `copy_small` copies them, as the first node of the step's CUDA graph."""
        n = step.small_ids
        np.concatenate(step.small, out=self._host_np["small"][:n])
        if not small_later:
            self._copy("small", n)
        for name, a in step.big.items():
            if a.size:
                self._host_np[name][: a.size] = a
                self._copy(name, a.size)

    def copy_small(self, n: int) -> None:
        """The staged fixed-size fields (`n` ids) to the device: a graph captures it as a copy from the pinned
        buffer, so a replay copies what the host staged last, without a host-side launch of its own."""
        self._copy("small", n)

    def views(self, step: HostStep) -> list[torch.Tensor]:
        """Views of the step's fixed-size fields, one after another in the device buffer."""
        dev, views, at = self._dev["small"], [], 0
        for a in step.small:
            views.append(dev[at: at + a.size])
            at += a.size
        return views

    def buffer(self, name: str) -> torch.Tensor:
        """The whole device buffer of a variable-length field."""
        return self._dev[name]
