"""Run a sweep: every point a full simulation, in parallel, each result appended at once.

Points run on local processes (``concurrent.futures.ProcessPoolExecutor``, ``workers``
of them) or on a Ray cluster (``ray_address``: ``"local"`` starts a local Ray with
``workers`` CPUs, anything else is passed to ``ray.init(address=...)``). Either way the
driver process is the only writer of the results table (:mod:`granisim.experiments.sweep_results`): each
point's row is written as soon as that point finishes. A re-run skips every point whose
row exists, so a killed sweep loses at most the points in flight. SIGINT / SIGTERM
(:mod:`granisim.experiments.stopping`) terminate the local workers or cancel the Ray tasks
in flight at once.

A row holds the point id, the overrides that define it (JSON), the full resolved
scenario (JSON), every scenario field flattened to a dotted column, the summary metrics
(:func:`granisim.core.metrics.summarize`), the cost breakdown totals ``t_<part>_s`` over all
steps (``steps.parquet``'s ``t_*`` columns summed), allocator counters, and the wall time
of the simulation. Everything but ``sim_wall_s`` is a deterministic function of the
scenario.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from granisim.experiments.sweep_results import ResultsStore
from granisim.config.scenario import Scenario, parse_scenario
from granisim.experiments.sweep_file import SweepSpec, scenario_columns
from granisim.experiments.stopping import SIGNALS, Stopped, process_pool

ALLOC_STATS = ("hot_placements", "hot_fallbacks", "hot_evictions", "compactions", "copied_tokens",
               "evicted_tokens")


def simulate_scenario(sc: Scenario) -> dict:
    """One full simulation; returns the summary plus breakdown totals and allocator counters."""
    from granisim.core.serving_loop import ServingLoop
    from granisim.costmodel.executor import for_setup
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare

    setup = prepare(sc)
    if sc.fleet is not None:  # N replicas behind a router: the fleet's figures, as `granisim run` gives them
        return _fleet_summary(sc, setup)
    eng = ServingLoop(setup, for_setup(setup), progress=False)
    res = eng.run()
    steps = res.steps.frame()
    summary = summarize(requests_frame(res.records), steps, res.end_s)
    summary.update(kv_budget_tokens=setup.kv_budget, m_sat=setup.m_sat)
    for c in steps.columns:
        if c.startswith("t_"):
            summary[f"{c}_s"] = float(steps[c].sum())
    groups = (steps.groups_dense + steps.groups_cascade + steps.groups_paged).mul(steps.num_steps).sum()
    summary["mean_group_size"] = float(steps.decode_requests.mul(steps.num_steps).sum() / groups) if groups else 0.0
    st = eng.allocator.stats()
    for k in ALLOC_STATS:
        summary[k] = int(getattr(st, k))
    summary["hot_capacity_end"] = int(st.pools["hot"].capacity) if "hot" in st.pools else 0
    return summary


def _breakdown(summary: dict, steps: pd.DataFrame) -> None:
    for c in steps.columns:
        if c.startswith("t_"):
            summary[f"{c}_s"] = float(steps[c].sum())
    if not len(steps):
        summary["mean_group_size"] = 0.0
        return
    groups = (steps.groups_dense + steps.groups_cascade + steps.groups_paged).mul(steps.num_steps).sum()
    summary["mean_group_size"] = float(steps.decode_requests.mul(steps.num_steps).sum() / groups) if groups else 0.0


def _fleet_summary(sc: Scenario, setup) -> dict:
    """A fleet point: the fleet summary (``granisim run``'s summary.json figures), breakdown totals over
    every replica's steps, allocator counters summed over replicas (HOT capacity: the sum at the end)."""
    from granisim.fleet.build import simulate_fleet
    from granisim.fleet.outputs import fleet_requests, fleet_steps, fleet_summary

    res = simulate_fleet(sc, progress=False)
    reqs, steps = fleet_requests(res), fleet_steps(res)
    summary = fleet_summary(res, reqs, steps)
    summary.update(kv_budget_tokens=setup.kv_budget, m_sat=setup.m_sat)
    _breakdown(summary, steps)
    for k in ALLOC_STATS + ("hot_capacity_end",):
        summary[k] = int(sum(rep.alloc.get(k, 0) for rep in res.replicas))
    return summary


def run_point(pid: str, scenario_json: str, overrides_json: str) -> dict:
    """Worker entry point (plain arguments: picklable for processes and Ray)."""
    sc = parse_scenario(json.loads(scenario_json))
    t0 = time.perf_counter()
    summary = simulate_scenario(sc)
    row = {"point_id": pid, "overrides": overrides_json, "scenario": scenario_json}
    row.update(scenario_columns(sc))
    row.update(summary)
    row["sim_wall_s"] = time.perf_counter() - t0
    return row


def _normalise(row: dict) -> dict:
    # mixed-type scenario fields (e.g. hot_fraction 0.2 | "adaptive") are stored as text
    return {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in row.items()}


def _args(p) -> tuple[str, str, str]:
    return p.pid, json.dumps(p.scenario.model_dump(mode="json"), sort_keys=True), json.dumps(p.overrides,
                                                                                          sort_keys=True)


def run_sweep(spec: SweepSpec, out: str | Path, *, workers: int | None = None, ray_address: str | None = None,
              progress: bool = True, max_points: int | None = None) -> pd.DataFrame:
    """Run the points of ``spec`` not yet in ``out``'s results; returns the whole table."""
    out = Path(out)
    store = ResultsStore(out)
    (out / "sweep.json").write_text(json.dumps({
        "name": spec.name, "source": spec.source, "points": len(spec.points), "varied": spec.varied,
        "base": spec.base.model_dump(mode="json"),
        "point_ids": [p.pid for p in spec.points]}, indent=2))
    done = store.done_ids()
    todo = [p for p in spec.points if p.pid not in done]
    if max_points is not None:
        todo = todo[:max_points]
    workers = workers or os.cpu_count() or 1
    n_done = len(spec.points) - len([p for p in spec.points if p.pid not in done])
    if progress:
        print(f"sweep {spec.name}: {len(spec.points)} points, {n_done} already done, {len(todo)} to run "
              f"({'ray ' + ray_address if ray_address else f'{workers} local processes'})")
    bar = None
    failures: list[dict] = []
    if todo:
        runner = _run_ray if ray_address else _run_local
        bar = tqdm(total=len(spec.points), initial=n_done, unit="pt", desc=spec.name, disable=not progress,
                   smoothing=0.05)
        by_id = {p.pid: p for p in todo}

        def done(pid: str, get) -> None:  # write a finished point at once; a failed one is reported
            try:
                store.write(_normalise(get()))
                _crash_for_tests(store, n_done)
            except Exception as err:  # noqa: BLE001 - one bad point must not stop the sweep
                failures.append({"point_id": pid, "overrides": by_id[pid].overrides,
                                 "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"})
            bar.update(1)

        try:
            runner(todo, done, workers, ray_address)
        finally:
            bar.close()
    fail_path = out / "failures.json"
    if failures:
        fail_path.write_text(json.dumps(failures, indent=2, default=str))
    elif fail_path.exists():
        fail_path.unlink()
    df = store.read([p.pid for p in spec.points])
    return df


class PointsFailed(RuntimeError):
    """Points of a sweep raised; the message is what :func:`failure_lines` says of them."""


def failure_lines(out: Path, done: int, total: int) -> list[str]:
    """What ``out``/failures.json says of a sweep's failed points: a line for each of the first five and a
    count; [] when no point failed (an unfinished sweep is then continued by running it again)."""
    fails = out / "failures.json"
    if not fails.exists():
        return []
    bad = json.loads(fails.read_text())
    return ([f"error: point {f['point_id']} {f['overrides']}: {f['error']}" for f in bad[:5]]
            + [f"{len(bad)} point(s) failed (all in {fails}); {done} of {total} done"])


def _crash_for_tests(store: ResultsStore, n_done: int) -> None:
    """Test hook, off unless GRANISIM_TEST_CRASH_AFTER=k is set: the driver dies at once (``os._exit``, no
    cleanup, as a SIGKILL leaves it) right after this run has written its k-th point, so a test can resume a
    killed sweep at a known point (tests/granisim/test_sweep.py)."""
    k = os.environ.get("GRANISIM_TEST_CRASH_AFTER")
    if k and len(store.done_ids()) - n_done >= int(k):
        os._exit(137)


def _run_local(todo, done, workers: int, _addr) -> None:
    if workers <= 1:
        for p in todo:
            done(p.pid, lambda p=p: run_point(*_args(p)))
        return
    with process_pool(workers, preload=["granisim.experiments.sweep"]) as ex:  # a stop terminates the workers
        futures = {ex.submit(run_point, *_args(p)): p.pid for p in todo}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                done(futures[f], f.result)


def _check_reachable(address: str) -> None:
    """Fail fast (one line) when a HOST:PORT address has nothing listening; ray.init would retry for minutes."""
    import socket

    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and other forms: left to ray.init
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ValueError(f"--ray {address}: nothing reachable there ({err.strerror or err}); start a head with "
                         f"`ray start --head` and pass the address it prints, or use --ray local") from None


def _run_ray(todo, done, workers: int, address: str) -> None:
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'granikv[cluster]' (or ray>=2.9)") from None

    started = False
    handlers = {s: signal.getsignal(s) for s in SIGNALS}  # ray.init replaces them (SIGTERM: log and abort)
    if not ray.is_initialized():
        if address == "local":
            ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        else:
            _check_reachable(address)
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False,
                         runtime_env={"py_modules": [str(Path(__file__).parent)]})
            except (ConnectionError, RuntimeError, ValueError) as err:  # one line naming --ray (exit 2)
                msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ValueError(f"--ray {address}: cannot connect to a Ray cluster ({msg})") from None
        started = True
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    try:
        remote = ray.remote(num_cpus=1)(run_point)
        refs = {remote.remote(*_args(p)): p.pid for p in todo}
        pending = list(refs)
        try:
            while pending:
                finished, pending = ray.wait(pending, num_returns=min(len(pending), 8), timeout=0.5)
                for ref in finished:
                    done(refs[ref], lambda ref=ref: ray.get(ref))
        except BaseException as err:  # a stop or an error: the cluster drops the points in flight
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            if isinstance(err, SystemError) and isinstance(err.__cause__, Stopped):
                raise err.__cause__ from None  # a stop inside Ray's C code reaches us wrapped
            raise
    finally:
        if started:
            ray.shutdown()
