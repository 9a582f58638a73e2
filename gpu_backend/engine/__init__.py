"""The real engine: a model-shaped forward with seeded random weights, driven by the same
scheduler and allocator as the simulator through the executor protocol."""
from .executor import GpuExecutor  # noqa: F401
from .model import RandomWeights  # noqa: F401
