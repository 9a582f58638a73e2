"""Small scenarios and runners shared by the simulator tests."""

from __future__ import annotations

from granisim.core.serving_loop import ServingLoop
from granisim.core.metrics import requests_frame
from granisim.config.scenario import parse_scenario
from granisim.experiments.run import prepare


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
