"""The real fleet on one device (CPU, tiny model, Triton interpreter): replicas take turns on the device with
their own KV buffers and one copy of the weights; `granisim validate` reports per replica and fleet-wide."""

import numpy as np
import pandas as pd
import pytest

from granisim.cli import main
from granisim.config.scenario import parse_scenario
from granisim.core.serving_loop import ServingLoop
from granisim.experiments.run import prepare
from granisim.fleet.build import simulate_fleet
from gpu_backend.executor.fleet import FleetExecutors
from tests.granisim.cli_errors import one_line_error

from gb_util import validate_on_cpu

TINY = {"name": "tiny-fleet", "seed": 4, "model": {"name": "tiny"}, "hardware": {"kv_budget_tokens": 512},
        "scheduler": {"fast_forward": False},
        "workload": {"roles": 2, "prefix_len": 24, "num_requests": 6, "rate": 100.0, "suffix_scale": 0.01,
                     "max_output_len": 3}}


def test_two_replicas_share_weights_and_give_single_replica_tokens():
    """Each replica gets its own executor and KV buffers, the weights are one object, every request completes,
    and every request's greedy tokens equal those of a single-replica (no fleet) run of the same scenario:
    the prompt (its context) is the same, and the weights are. Planted bug: drawing each replica's weights with
    its own seed (``seed + made`` in FleetExecutors) fails here (at the shared-weights check)."""
    sc = parse_scenario({**TINY, "fleet": {"replicas": 2, "router": "round_robin"}})
    make = FleetExecutors("cpu")
    res = simulate_fleet(sc, make_executor=make, progress=False, keep_outputs=True)
    assert make.made == 2 and len(make.weights) == 1
    (a,), (b,) = (rep.executors for rep in res.replicas)
    assert a.w is b.w and a.k_cache[0].data_ptr() != b.k_cache[0].data_ptr()
    recs = [r for _, r in res.records]
    assert len(recs) == 6 and all(r.status == "completed" for r in recs)
    assert {i for i, _ in res.records} == {0, 1}

    single = parse_scenario(TINY)
    setup = prepare(single)
    loop = ServingLoop(setup, FleetExecutors("cpu")(setup), progress=False, keep_outputs=True)
    loop.run()
    fleet_out = {rid: t for rep in res.replicas for rid, t in rep.outputs.items()}
    assert fleet_out.keys() == loop.outputs.keys()
    for rid, tokens in loop.outputs.items():
        assert np.array_equal(fleet_out[rid], tokens), rid


def test_validate_on_a_fleet_reports_every_replica(tmp_path, capsys):
    _, rep, steps = validate_on_cpu(
        tmp_path, 'name = "tiny-fleet"\nseed = 4\n[model]\nname = "tiny"\n[hardware]\nkv_budget_tokens = 512\n'
        "[workload]\nroles = 2\nprefix_len = 24\nnum_requests = 6\nrate = 100.0\nsuffix_scale = 0.01\n"
        'max_output_len = 3\n[fleet]\nreplicas = 2\nrouter = "cache_aware"\n')
    path = tmp_path / "scenario.toml"
    assert rep["num_replicas"] == 2 and rep["completed"] == rep["requests"] == 6
    assert [r["replica"] for r in rep["replicas"]] == [0, 1]
    assert sum(r["steps"] for r in rep["replicas"]) == rep["steps"] == len(steps)
    assert set(steps.replica) <= {0, 1} and (steps.measured_s > 0).all()
    for r in rep["replicas"]:
        if r["steps"]:
            assert r["step_errors"]["total"]["n"] == (steps.replica == r["replica"]).sum()
    # the simulated fleet again on the real fleet's routing: every request where the real router sent it
    assert rep["measured_routing"]["same_replica"] == 1.0
    assert {r["replica"] for r in rep["measured_routing"]["replicas"]} == {r["replica"] for r in rep["replicas"]
                                                                           if r["requests"]}
    md = capsys.readouterr().out
    assert "## Fleet" in md and "## Replica 0" in md and "## Replica 1" in md and "real fleet's routing" in md
    # the run folder is complete for the summary table (it re-runs the measured routing from scenario.toml)
    assert main(["validation", "fleet-summary", str(tmp_path / "val"), "--out", str(tmp_path / "s.json")]) == 0
    assert "tiny-fleet" in capsys.readouterr().out
    assert main(["run", str(path), "--executor", "gpu", "--device", "cpu", "--out", str(tmp_path / "run")]) == 0
    reqs = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert (reqs.status == "completed").all() and set(reqs.replica) <= {0, 1}


def test_validate_without_a_cuda_device_makes_no_output_folder(tmp_path, monkeypatch, capsys):
    """`granisim validate` of a fleet where the device is missing: one line, exit 2, and no output folder.
    Planted: the device was first checked when the first replica's executor was built, after the fleet's
    output folder was made, which the failed run left empty."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "f.toml"
    path.write_text('name = "f"\n[model]\nname = "tiny"\n[workload]\nroles = 2\nprefix_len = 24\nnum_requests = 4\n'
                    'rate = 10.0\n[fleet]\nreplicas = 2\n')
    assert main(["validate", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


SMALL = ('[workload]\nroles = 2\nprefix_len = 24\nnum_requests = 4\nrate = 10.0\nmax_output_len = 4\n'
         '[hardware]\nkv_budget_tokens = 512\n')


@pytest.mark.parametrize("argv, device, cuda, env, needles", [
    # catches: a --device torch cannot read was a RuntimeError traceback (run, validate; from every rank at tp > 1)
    (["run", "S", "--executor", "gpu"], "nonsense", 0, "1", ["--device 'nonsense'", "cuda, cuda:N or cpu"]),
    (["validate", "S"], "nonsense", 0, "1", ["--device 'nonsense'", "cuda, cuda:N or cpu"]),
    (["validate", "T"], "nonsense", 0, "1", ["--device 'nonsense'", "cuda, cuda:N or cpu"]),
    (["validate", "S"], "meta", 0, "1", ["--device meta", "cuda or cpu"]),
    # ... a CUDA index past the machine's devices failed on the first tensor, after the weights were drawn
    (["validate", "S"], "cuda:7", 2, "1", ["--device cuda:7", "2 CUDA device(s)", "cuda:0 to cuda:1"]),
    # ... a CPU without the Triton interpreter failed at the first kernel ("0 active drivers")
    (["validate", "S"], "cpu", 0, "0", ["--device cpu", "TRITON_INTERPRET=1"]),
    (["validate", "T"], "cpu", 0, "", ["--device cpu", "TRITON_INTERPRET=1"]),
    (["run", "F", "--executor", "gpu"], "cpu", 0, "", ["--device cpu", "TRITON_INTERPRET=1"]),
    # ... a full-size model on a CPU allocated its weights and KV budget until the kernel's OOM killer ended the
    # process (exit 137, no message)
    (["validate", "L"], "cpu", 0, "1", ["--device cpu", "llama-3.1-8b", "more than this machine's 1.0 GB"]),
    (["run", "L", "--executor", "gpu"], "cpu", 0, "1", ["--device cpu", "llama-3.1-8b", "1.0 GB"]),
], ids=["run nonsense", "validate nonsense", "validate tp nonsense", "meta", "cuda index", "cpu no interpreter",
        "tp cpu no interpreter", "fleet cpu no interpreter", "cpu full-size model", "run cpu full-size model"])
def test_a_device_the_engine_cannot_use_is_one_line(tmp_path, monkeypatch, capsys, argv, device, cuda, env, needles):
    import torch

    import gpu_backend.executor as executor

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
    monkeypatch.setattr(executor, "host_memory_bytes", lambda: 10**9)
    monkeypatch.setenv("TRITON_INTERPRET", env)
    text = {"S": '[model]\nname = "tiny"\n' + SMALL, "T": '[model]\nname = "tiny-tp"\n' + SMALL + "tp = 2\n",
            "F": '[model]\nname = "tiny"\n' + SMALL + "[fleet]\nreplicas = 2\n",
            "L": SMALL.replace("kv_budget_tokens = 512", "kv_budget_tokens = 100000")}[argv[1]]
    path = tmp_path / "s.toml"
    path.write_text(text)
    out = tmp_path / "out"
    rc = main([argv[0], str(path), *argv[2:], "--device", device, "--out", str(out)])
    one_line_error(capsys, rc, *needles)
    assert not out.exists()
