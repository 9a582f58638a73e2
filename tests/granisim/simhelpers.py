"""Small scenarios and runners shared by the simulator tests."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from granisim.core.serving_loop import ServingLoop
from granisim.core.metrics import requests_frame
from granisim.config.scenario import parse_scenario
from granisim.experiments.run import prepare


# a tiny multi-agent scenario as TOML text, after a `name = ...` line (validation tests write it to a file)
TINY_TOML = """seed = 5
[workload]
kind = "multi_agent"
roles = 4
prefix_len = 512
num_requests = 30
rate = 30.0
max_output_len = 16
[scheduler]
max_batch_tokens = 4096
"""


def small(**over):
    """A fast multi-agent scenario (Llama-3.1-8B on A100), overridable by dotted keys."""
    base = {
        "name": "small", "seed": 3,
        "workload": {"kind": "multi_agent", "roles": 2, "prefix_len": 1024, "num_requests": 40, "rate": 20.0,
                     "max_output_len": 64},
        "scheduler": {"max_batch_tokens": 4096},
    }
    sc = parse_scenario(base)
    return sc.with_changes(**over) if over else sc


def run(scenario, executor=None):
    setup = prepare(scenario)
    if executor is None:
        from granisim.costmodel.executor import CostExecutor

        executor = CostExecutor(setup.profile, setup.model)
    eng = ServingLoop(setup, executor, progress=False)
    res = eng.run()
    return setup, eng, res, requests_frame(res.records)


class NoisyEngine:
    """Stands in for the real engine: the cost model's step times, each off by a seeded factor drawn from
    [low, high), so that the "measured" schedule is not the simulator's own."""

    needs_layouts = False
    max_steps_per_plan = 1

    def __init__(self, setup, seed: int, low: float, high: float):
        from granisim.costmodel.executor import CostExecutor

        self.cost, self.rng = CostExecutor(setup.profile, setup.model), np.random.default_rng(seed)
        self.low, self.high = low, high

    def execute(self, plan):
        r = self.cost.execute(plan)
        return replace(r, duration_s=r.duration_s * float(self.rng.uniform(self.low, self.high)))
