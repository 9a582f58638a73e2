"""A tensor-parallel replica of the real engine: one process per rank, torch.distributed between them.

Rank 0 runs the serving loop (the same scheduler and allocator as ever) with a :class:`TpExecutor`;
every plan it executes is broadcast (pickled, ``broadcast_object_list``) to the other ranks, which
run the same step on their shard (:func:`serve`) until rank 0 sends ``None``.

The forward is Megatron-style (as vLLM's): QKV and MLP gate/up projections column-parallel (a rank
holds its query and KV heads and its slice of the intermediate columns), O and MLP down projections
row-parallel, each followed by an all-reduce of the ``T x hidden`` activations — the two all-reduces
per layer the cost model prices (granisim/costmodel/parallel.py). Norms, the embedding and the LM
head are replicated, so every rank computes the same logits. A rank's KV cache holds its KV heads
only (attention is per head: the kernels run unchanged over the rank's heads).

Weights are drawn from the full model's seeded stream and sliced as they are drawn
(``RandomWeights(..., keep=...)``), so tp = 1 and tp = N compute the same function (up to the order
of the all-reduce's additions). NCCL on GPUs (rank r on ``cuda:r``), gloo on CPUs. Steps run eagerly
(no CUDA graphs: the all-reduces are not captured).
"""

from __future__ import annotations

import os
import socket
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from granisim.config.models import ModelShape, get_model
from granisim.core.contract import BatchPlan, StepResult

from .executor import GpuExecutor
from .model import RandomWeights


def slicer(full: ModelShape, tp: int, rank: int) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """``keep(name, tensor)`` for RandomWeights: rank ``rank``'s slice of each layer weight."""
    d, nq, nkv, inter = full.head_dim, full.n_q_heads, full.n_kv_heads, full.intermediate
    q0, q1 = rank * nq // tp * d, (rank + 1) * nq // tp * d
    k0, k1 = rank * nkv // tp * d, (rank + 1) * nkv // tp * d
    i0, i1 = rank * inter // tp, (rank + 1) * inter // tp

    def qkv_rows(t):  # [(nq + 2 nkv) d, ...]: the rank's query heads, then its K heads, then its V heads
        return torch.cat([t[q0:q1], t[nq * d + k0: nq * d + k1], t[(nq + nkv) * d + k0: (nq + nkv) * d + k1]])

    def keep(name: str, t: torch.Tensor) -> torch.Tensor:
        if name in ("wqkv", "bqkv"):
            return qkv_rows(t).contiguous()
        if name == "wo":  # [h, nq d]: the columns of the rank's query heads
            return t[:, q0:q1].contiguous()
        if name == "w_gate_up":  # [2 I, h]: gate rows then up rows
            return torch.cat([t[i0:i1], t[inter + i0: inter + i1]]).contiguous()
        if name == "w_down":  # [h, I]
            return t[:, i0:i1].contiguous()
        raise ValueError(f"unknown layer weight {name!r}")

    return keep


def shard_weights(full: ModelShape, tp: int, rank: int, *, device, dtype=None, seed: int = 0) -> RandomWeights:
    w = RandomWeights(full, device=device, dtype=dtype, seed=seed, keep=slicer(full, tp, rank) if tp > 1 else None)
    w.shape = full.shard(tp)
    return w


class TpShardExecutor(GpuExecutor):
    """One rank's engine: the GPU executor over the rank's shard, with an all-reduce after the row-parallel
    O and down projections. ``execute`` must be called on every rank with the same plan (collectives)."""

    def __init__(self, full: ModelShape, tp: int, rank: int, num_slots: int, *, device="cpu", seed: int = 0,
                 dtype=None, **options):
        self.tp, self.rank, self.full = tp, rank, full
        w = shard_weights(full, tp, rank, device=device, dtype=dtype, seed=seed)
        super().__init__(full.shard(tp), num_slots, device=device, seed=seed, graphs=False, weights=w, **options)

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a row-parallel projection's partial outputs over the ranks (GpuExecutor._forward calls it
        after the output projection and the MLP's down projection; the cost model prices it in `linear`)."""
        if self.tp > 1:
            dist.all_reduce(t)
        return t


class TpExecutor:
    """Rank 0's executor (granisim.core.contract.Executor): broadcasts each plan, runs its own shard, returns
    its result (its clock: every rank runs the same step in lock step). ``close()`` releases the other ranks."""

    needs_layouts = True
    max_steps_per_plan = 1

    def __init__(self, full: ModelShape, tp: int, num_slots: int, **options):
        self.shard = TpShardExecutor(full, tp, 0, num_slots, **options)
        self.tp = tp

    @property
    def w(self):
        return self.shard.w

    @property
    def last_logits(self):
        return self.shard.last_logits

    @property
    def device(self):
        return self.shard.device

    def stats(self) -> dict:
        return {"tp": self.tp, **self.shard.stats()}

    def idle(self, seconds: float) -> None:
        """Wait out an arrival gap (GpuExecutor.idle); the other ranks wait for the next plan meanwhile."""
        self.shard.idle(seconds)

    def execute(self, plan: BatchPlan) -> StepResult:
        if self.tp > 1:
            dist.broadcast_object_list([plan], src=0)
        return self.shard.execute(plan)

    def close(self) -> None:
        if self.tp > 1:
            dist.broadcast_object_list([None], src=0)


def serve(ex: TpShardExecutor) -> int:
    """A rank > 0: run every plan rank 0 broadcasts until it sends None; the number of steps run."""
    n = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return n
        ex.execute(box[0])
        n += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, tp: int, port: int, model: str, num_slots: int, options: dict,
               rank0_main: Callable, args: tuple) -> None:
    cuda = options.get("device", "cpu") == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        options = {**options, "device": f"cuda:{rank}"}
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=tp)
    try:
        full = get_model(model)
        if rank == 0:
            ex = TpExecutor(full, tp, num_slots, **options)
            try:
                rank0_main(ex, *args)
            finally:
                ex.close()
        else:
            serve(TpShardExecutor(full, tp, rank, num_slots, **options))
    finally:
        dist.destroy_process_group()


def run_replica(tp: int, model: str, num_slots: int, rank0_main: Callable, *args, **options) -> None:
    """Start ``tp`` rank processes (spawned; a free localhost port) and run ``rank0_main(executor, *args)`` on
    rank 0 (a module-level function: it is pickled). ``options`` go to every rank's executor (device 'cpu' or
    'cuda', seed, ...). Returns when every rank has finished; a rank's exception is raised here."""
    mp.spawn(_rank_main, args=(tp, free_port(), model, num_slots, options, rank0_main, args), nprocs=tp, join=True)


class FirstLogits:
    """An executor wrapper that keeps each request's first logits (those of its first output token), when the
    wrapped executor keeps logits (``keep_logits=True``)."""

    def __init__(self, ex):
        self.ex, self.first = ex, {}
        self.needs_layouts, self.max_steps_per_plan = ex.needs_layouts, ex.max_steps_per_plan

    def execute(self, plan: BatchPlan) -> StepResult:
        res = self.ex.execute(plan)
        for rid, lg in self.ex.last_logits.items():
            self.first.setdefault(rid, lg.float())
        return res


def serve_scenarios(ex: TpExecutor, scenarios: list, out_path: str) -> None:
    """A rank-0 main: serve each scenario (dicts, as parse_scenario takes) in turn with ``ex`` and pickle, per
    scenario, the greedy outputs (request id -> tokens), the step count and each request's first logits (empty
    unless the ranks keep logits) to ``out_path``."""
    import pickle

    from granisim.config.scenario import parse_scenario
    from granisim.core.serving_loop import ServingLoop
    from granisim.experiments.run import prepare

    got = []
    for sc in scenarios:
        rec = FirstLogits(ex)
        eng = ServingLoop(prepare(parse_scenario(sc)), rec, progress=False, keep_outputs=True)
        res = eng.run()
        got.append({"outputs": {rid: list(map(int, t)) for rid, t in eng.outputs.items()},
                    "steps": len(res.steps.frame()), "first_logits": rec.first})
    with open(out_path, "wb") as f:
        pickle.dump(got, f)


def validate_scenario(ex: TpExecutor, scenario: dict, source: str, out: str, progress: bool = True,
                      idle: bool = True) -> None:
    """A rank-0 main: ``granisim validate`` of ``scenario`` (a dict, as parse_scenario takes; ``source`` names it
    in messages) with the replica's ranks, written to ``out`` (granisim.validation.validate.validate)."""
    from pathlib import Path

    from granisim.config.scenario import parse_scenario
    from granisim.experiments.run import prepare
    from granisim.validation.validate import validate

    validate(prepare(parse_scenario(scenario), source), ex, Path(out), progress=progress, idle=idle)


def validate_replica(setup, out, device: str = "cuda", source: str = "<scenario>", progress: bool = True,
                     idle: bool = True) -> None:
    """``granisim validate`` of a tensor-parallel scenario (``hardware.tp`` > 1) into ``out``: ``tp`` rank
    processes, rank r on ``cuda:r`` (NCCL) or on the CPU (gloo, ``device='cpu'``)."""
    from gpu_backend.executor import check_device

    check_device(device)  # in this process: a bad --device is one line, not a traceback from every rank
    tp, host_gb = setup.scenario.hardware.tp, setup.scenario.hardware.host_kv_gb
    if host_gb:
        raise ValueError(f"{source}: field hardware.host_kv_gb = {host_gb}: the real engine's host tier runs at "
                         f"tp = 1 only")
    if device == "cuda" and torch.cuda.device_count() < tp:
        raise ValueError(f"{source}: field hardware.tp = {tp}: the real engine needs {tp} GPUs, this machine "
                         f"has {torch.cuda.device_count()}")
    run_replica(tp, setup.model.name, setup.kv_budget, validate_scenario, setup.scenario.model_dump(), source,
                str(out), progress, idle, device=device, seed=setup.scenario.seed)
