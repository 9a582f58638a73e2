"""A fleet of replicas on one device: one GpuExecutor per replica, one copy of the model weights.

The fleet loop (granisim.fleet) is a single SimPy process per replica in one thread, so replicas
take turns on the device one step at a time: each ``execute`` runs one replica's step alone on the
device and measures it with CUDA events, and that replica's clock advances by what was measured
while the router decides from every replica's live state. Each replica has its own KV buffers
(its own executor, sized by its own KV budget); the weights are drawn once per model and seed and
shared. A replica that comes back after a fault gets a fresh executor (an empty cache), sharing
the same weights.
"""

from __future__ import annotations


class FleetExecutors:
    """``make(setup)`` for :class:`granisim.fleet.loop.FleetLoop`: a GpuExecutor per call, shared weights."""

    def __init__(self, device: str = "cuda", **options):
        from gpu_backend.executor import check_device

        check_device(device)  # before the fleet's output folder is made
        self.device, self.options = device, options
        self.weights: dict[tuple, object] = {}  # (model name, seed) -> RandomWeights
        self.made = 0

    def __call__(self, setup):
        from gpu_backend.executor import for_setup

        key = (setup.model.name, setup.scenario.seed)
        ex = for_setup(setup, self.device, weights=self.weights.get(key), **self.options)
        self.weights.setdefault(key, ex.w)
        self.made += 1
        return ex
