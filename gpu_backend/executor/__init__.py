"""The real engine: a model-shaped forward with seeded random weights, driven by the same
scheduler and allocator as the simulator through the executor protocol."""
from .executor import GpuExecutor  # noqa: F401
from .model import RandomWeights  # noqa: F401


def check_device(device: str) -> None:
    """ValueError in one line where ``device`` is CUDA and this machine has none."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--executor gpu: no CUDA device here (use --device cpu with TRITON_INTERPRET=1 "
                         "for a tiny model)")


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
    return GpuExecutor(setup.model, setup.kv_budget, device=device, seed=setup.scenario.seed,
                       host_tokens=tier.capacity_tokens if tier else 0, **options)
