"""The real engine: a model-shaped forward with seeded random weights, driven by the same
scheduler and allocator as the simulator through the executor protocol."""
import os

import torch
import triton

from .executor import GpuExecutor  # noqa: F401
from .model import RandomWeights  # noqa: F401


def check_device(device: str) -> None:
    """ValueError in one line where the engine cannot run on ``device``: not a torch device, CUDA where this
    machine has none (or not that index), a CPU without the Triton interpreter, any other kind."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {device!r}: not a device; use cuda, cuda:N or cpu") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--executor gpu: no CUDA device here (use --device cpu with TRITON_INTERPRET=1 "
                             "for a tiny model)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    elif dev.type == "cpu":
        if not triton.knobs.runtime.interpret:  # TRITON_INTERPRET, as triton reads it
            raise ValueError(f"--device {device}: the engine's Triton kernels run on a CPU only in the interpreter; "
                             f"set TRITON_INTERPRET=1 (for a tiny model)")
    else:
        raise ValueError(f"--device {device}: the engine runs on cuda or cpu, not {dev.type}")


def host_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _fits_host_memory(setup, host_tokens: int) -> None:
    """ValueError in one line where the engine on the CPU would allocate more than the machine's memory: the model's
    weights and its KV budget (and host tier), at the simulator's bytes per weight and token (a lower bound)."""
    model = setup.model
    need = model.weight_bytes + (setup.kv_budget + host_tokens) * model.kv_bytes_per_token
    have = host_memory_bytes()
    if need > have:
        raise ValueError(f"--device cpu: {model.name}'s weights and KV budget of {setup.kv_budget} tokens take "
                         f"{need / 1e9:.1f} GB, more than this machine's {have / 1e9:.1f} GB of memory; the CPU "
                         f"engine is for tiny models (model.name = 'tiny', or a small hardware.kv_budget_tokens)")


def for_setup(setup, device: str = "cuda", **options) -> GpuExecutor:
    """The executor for a prepared scenario (``granisim.experiments.run.prepare``) on ``device``."""
    scale = setup.scenario.hardware.step_time_scale
    if scale != 1.0:  # a what-if on predicted times: the real engine measures its own
        raise ValueError(f"field hardware.step_time_scale = {scale}: scales the cost model's step times; the "
                         f"real engine measures them (drop it, or use the cost executor)")
    check_device(device)
    tp = setup.scenario.hardware.tp
    if tp > 1:  # one process would run one GPU's shard without its all-reduces
        raise ValueError(f"field hardware.tp = {tp}: the real engine runs a tensor-parallel replica (one process "
                         f"a GPU) under `granisim validate` only (gpu_backend/executor/tp.py)")
    from granisim.kv.host_tier import host_tier_config

    tier = host_tier_config(setup.scenario, setup.model)
    if torch.device(device).type == "cpu":  # found here, not by the kernel's OOM killer mid-allocation
        _fits_host_memory(setup, tier.capacity_tokens if tier else 0)
    return GpuExecutor(setup.model, setup.kv_budget, device=device, seed=setup.scenario.seed,
                       host_tokens=tier.capacity_tokens if tier else 0, **options)
