"""The Perfetto trace of a run (trace.json): named processes and threads, one async track per request
whose queue / prefill / decode slices tile the request's life as the requests frame records it,
and one process per replica when the frames carry a ``replica`` column.

Shown to catch a wrong track: with prefill ending at the request's finish instead of its first
token (plots.request_events), the tiling check fails.
"""

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from granisim.config.scenario import parse_scenario
from granisim.experiments.plots import perfetto_trace
from granisim.experiments.run import prepare, simulate, write_outputs

SCENARIO = {"name": "trace", "seed": 1,
            "workload": {"roles": 2, "prefix_len": 512, "num_requests": 40, "rate": 40.0, "max_output_len": 16},
            "scheduler": {"max_waiting": 8}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    setup = prepare(parse_scenario(SCENARIO))
    write_outputs(setup, simulate(setup, progress=False), out)
    return (json.loads((out / "trace.json").read_text())["traceEvents"], pd.read_parquet(out / "requests.parquet"),
            pd.read_parquet(out / "steps.parquet"))


def _names(events):
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    return procs, threads


def _tracks(events):
    """Per request id, its async events in order, after checking every end closes the innermost open
    slice of that name (b/e balanced and nested)."""
    tracks = defaultdict(list)
    for e in events:
        if e.get("cat") == "request":
            tracks[e["id"]].append(e)
    for rid, evs in tracks.items():
        stack = []
        for e in evs:
            if e["ph"] == "b":
                stack.append(e["name"])
            elif e["ph"] == "e":
                assert stack and stack[-1] == e["name"], f"request {rid}: end of {e['name']} closes {stack}"
                stack.pop()
        assert not stack, f"request {rid}: slices left open {stack}"
    return tracks


def test_processes_and_threads_are_named(run):
    events, _, steps = run
    procs, threads = _names(events)
    assert procs == {1: "engine"}
    assert threads == {(1, 1): "steps", (1, 2): "cost breakdown"}
    assert sum(e["ph"] == "X" and e["tid"] == 1 for e in events) == len(steps)


def test_one_track_per_request_tiles_queue_prefill_decode(run):
    events, reqs, _ = run
    tracks = _tracks(events)
    assert set(tracks) == set(reqs.rid)
    done = reqs[reqs.status == "completed"]
    assert 0 < len(done) < len(reqs), "the scenario should complete some requests and reject others"
    for r in done.itertuples():
        evs = tracks[r.rid]
        assert [(e["name"], e["ph"]) for e in evs] == [
            (f"request {r.rid}", "b"), ("queue", "b"), ("queue", "e"), ("prefill", "b"), ("prefill", "e"),
            ("decode", "b"), ("decode", "e"), (f"request {r.rid}", "e")]
        ts = [e["ts"] / 1e6 for e in evs]
        want = [r.arrival_s, r.arrival_s, r.arrival_s + r.queue_s, r.arrival_s + r.queue_s, r.arrival_s + r.ttft_s,
                r.arrival_s + r.ttft_s, r.finish_s, r.finish_s]
        np.testing.assert_allclose(ts, want, rtol=0, atol=1e-9)
        assert {e["pid"] for e in evs} == {1}
    for r in reqs[reqs.status != "completed"].itertuples():
        (ev,) = tracks[r.rid]
        assert ev["ph"] == "n" and ev["name"].startswith(f"request {r.rid} {r.status}")


def test_one_process_per_replica(run, tmp_path):
    _, reqs, steps = run
    reqs = reqs.assign(replica=reqs.rid % 2)
    steps = steps.assign(replica=np.arange(len(steps)) % 2)
    path = tmp_path / "trace.json"
    perfetto_trace(steps, path, reqs)
    events = json.loads(path.read_text())["traceEvents"]
    procs, threads = _names(events)
    assert procs == {1: "replica 0", 2: "replica 1"}
    assert set(threads) == {(p, t) for p in (1, 2) for t in (1, 2)}
    tracks = _tracks(events)
    for r in reqs.itertuples():
        assert {e["pid"] for e in tracks[r.rid]} == {r.replica + 1}
    step_pids = [e["pid"] for e in events if e["ph"] == "X" and e["tid"] == 1]
    assert step_pids == [int(x) + 1 for x in steps.replica]
