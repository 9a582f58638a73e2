"""CUDA graphs of whole steps, one per `StepShape` (and metadata-arena generation).

A step's launches depend only on its shape (rows.py), and its metadata lives at fixed arena
addresses (arena.py), so a graph captured for one step replays any later step of the same
shape after its metadata is copied in. Capture follows the torch recipe: one eager warm-up
on a side stream (compiles every Triton kernel, fills launcher caches), then capture into a
memory pool shared by all graphs (steps run one at a time and their outputs are read before
the next replay), and one launch: a graph's first launch uploads it (a one-off that the
replays after it do not pay). Every launch recomputes the same step from the same inputs
(same K/V to the same slots), so the extra one changes nothing. The step's part timer is
captured with it (event-record nodes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from .rows import StepShape
from .timing import PartTimer


@dataclass
class StepGraph:
    graph: torch.cuda.CUDAGraph
    outputs: tuple[torch.Tensor, ...]
    timer: PartTimer


class GraphCache:
    def __init__(self, device: torch.device):
        self.device = device
        self.pool = None  # the first graph's pool, shared by the later ones (graph.pool())
        self._graphs: dict[StepShape, StepGraph] = {}
        self._generation = None
        self.captures = 0
        self.replays = 0
        self.capture_s = 0.0

    def lookup(self, shape: StepShape, generation: int) -> StepGraph | None:
        self.retire_stale(generation)
        return self._graphs.get(shape)

    def retire_stale(self, generation: int) -> None:
        """Drop every graph when the metadata buffers moved (each would read stale addresses). Destroying
        them and their memory pool is slow with many graphs: a one-off of the growth (executor.py)."""
        if generation != self._generation:
            self.clear()
            self._generation = generation

    def capture(self, shape: StepShape, forward: Callable[[PartTimer], tuple[torch.Tensor, ...]]) -> StepGraph:
        t = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(PartTimer(self.device, enabled=False))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        timer = PartTimer(self.device, in_graph=True)
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = forward(timer)
        graph.replay()  # the first launch uploads the graph to the device: a one-off like the capture
        if self.pool is None:
            self.pool = graph.pool()
        self.captures += 1
        self.capture_s += time.perf_counter() - t
        entry = self._graphs[shape] = StepGraph(graph, outputs, timer)
        return entry

    def replay(self, entry: StepGraph) -> tuple[torch.Tensor, ...]:
        entry.graph.replay()
        self.replays += 1
        return entry.outputs

    def clear(self) -> None:
        self._graphs.clear()
        self.pool = None  # a pool no graph holds any more cannot be captured into again
