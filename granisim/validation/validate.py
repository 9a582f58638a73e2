"""Predicted vs measured: the same scenario and seed through the real engine and the simulator.

``validate(setup, gpu_executor, out)``:

1. runs the engine loop with the GPU executor; every executed plan is also priced by the
   cost model (the *same* plan), giving per-step predicted vs measured pairs per
   breakdown key — the prediction error of the cost model free of any scheduling drift;
2. runs the simulator alone (cost executor) on the same scenario and seed, giving the
   end-to-end predictions (throughput, TTFT, TPOT percentiles) to set against the
   measured run's.

3. with ``idle`` (the default), the real run waits out the gaps between arrivals in wall-clock
   time (:meth:`PairedExecutor.idle`), as a server would; the report records whether it did.

Writes ``validation.json`` (with ``percentile_errors``: TTFT/TPOT/E2E at p50/p90/p99),
``validation.md``, ``steps.parquet``, ``measured_requests.parquet``, ``predicted_requests.parquet``
and plots into ``out``.
"""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.costmodel import step_cost
from granisim.costmodel.host_build import after_each
from granisim.core.metrics import BREAKDOWN_KEYS, requests_frame, summarize
from granisim.core.contract import BatchPlan, StepResult

E2E_KEYS = ("throughput_rps", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
TARGETS = {"step_median": 0.03, "throughput_rps": 0.05, "tpot_p50_s": 0.05, "tpot_p99_s": 0.05,
           "ttft_p99_s": 0.10}


class PairedExecutor:
    """Runs the real executor and prices the same plan with the cost model. With ``idle`` (default), the
    serving loop's gaps between arrivals reach the real executor's ``idle(seconds)`` when it has one.

    Each step's row also records ``host_between_s``: the wall time from the end of the previous step's
    call to the start of this one, less any idling in between (the serving loop's own host work for the
    step: scheduling, allocation, applying the previous result; NaN for the first step). The same code
    runs on every machine, so it times the host the engine's own host work runs on. ``host_gaps`` False
    (a fleet's replicas, which take turns on one GPU: other replicas' steps fall in between) leaves it out."""

    def __init__(self, real, profile, model, idle: bool = True, clock=time.perf_counter, host_gaps: bool = True):
        self.real, self.profile, self.model, self.clock = real, profile, model, clock
        self.host_gaps = host_gaps
        self.idle_on = idle and hasattr(real, "idle")
        self.idled_s = 0.0
        self.needs_layouts = real.needs_layouts
        self.max_steps_per_plan = real.max_steps_per_plan
        self.rows: list[dict] = []
        self.plans: list[BatchPlan] = []  # without slot data: enough to re-price the run with another profile
        self._left: float | None = None  # perf_counter when the previous step's call returned
        self._last_plan: BatchPlan | None = None  # priced after it (a step the engine derives from it is cheaper)
        self._idle_since = 0.0  # wall seconds idled since then

    def idle(self, seconds: float) -> None:
        if self.idle_on:
            t = self.clock()
            self.idled_s += seconds
            self.real.idle(seconds)
            self._idle_since += self.clock() - t

    def execute(self, plan: BatchPlan) -> StepResult:
        t = self.clock()
        between = float("nan") if self._left is None else max(0.0, t - self._left - self._idle_since)
        measured = self.real.execute(plan)
        self.plans.append(replace(plan, requests=tuple(replace(r, layout=None, new_slots=None, input_tokens=None)
                                                       for r in plan.requests)))
        row = {"step": plan.step, "batch": len(plan.requests), "tokens": plan.num_tokens,
               "prefill": any(r.is_prefill for r in plan.requests), **_columns("measured", measured)}
        after = self._last_plan
        self._last_plan = plan
        self.rows.append({**row, **_columns("predicted", step_cost(plan, self.profile, self.model, after)),
                          **({"host_between_s": between} if self.host_gaps else {})})
        self._left, self._idle_since = self.clock(), 0.0
        return measured


def _columns(side: str, r: StepResult) -> dict:
    """A step's total and parts; the cost model's ``host_copy`` (host-tier transfers) joins ``kv_copy``, the span
    in which the real engine measures its compaction copies and its transfers together."""
    out = {f"{side}_s": r.duration_s, **{f"{side}_{k}": r.breakdown.get(k, 0.0) for k in BREAKDOWN_KEYS}}
    if r.breakdown.get("host_copy"):
        out[f"{side}_kv_copy"] += r.breakdown["host_copy"]
    return out


def reprice(steps: pd.DataFrame, plans: list[BatchPlan], profile, model) -> pd.DataFrame:
    """A measured run's steps with the predictions of another profile (the run's stored plans)."""
    priced = pd.DataFrame([_columns("predicted", step_cost(p, profile, model, after))
                           for after, p in after_each(plans)], index=steps.index)
    return steps.assign(**priced)


def end_to_end(measured: dict, predicted: dict) -> dict:
    """Relative error of the simulator's summary against the real engine's, per end-to-end metric."""
    return {k: {"measured": measured[k], "predicted": predicted[k],
                "error": abs(predicted[k] - measured[k]) / measured[k] if measured[k] else float("nan")}
            for k in E2E_KEYS}


LATENCIES = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}  # name in the report -> requests-frame column
QUANTILES = (50, 90, 99)


def percentile_errors(measured: pd.DataFrame, predicted: pd.DataFrame) -> dict:
    """Latency errors the way peers report them (BLIS's convention: per workload, TTFT, ITL and E2E at
    p50/p90/p99). Definition used here: for latency L in {ttft, tpot (= ITL: the mean gap between a
    request's output tokens after the first), e2e} and quantile q in {50, 90, 99}, ``measured`` is
    ``numpy.percentile`` (linear interpolation) of L over the real engine's completed requests,
    ``predicted`` the same over the simulator-alone run's completed requests (same scenario and seed), and
    ``error`` = |predicted - measured| / measured, the absolute percentage error (as a fraction) of that
    percentile. A MAPE over workloads is the mean of these errors (``granisim validation summary``).
    Requests without a value (a one-token output has no TPOT) are left out."""
    out = {}
    for name, col in LATENCIES.items():
        m = measured.loc[measured.status == "completed", col].dropna().to_numpy(float)
        p = predicted.loc[predicted.status == "completed", col].dropna().to_numpy(float)
        for q in QUANTILES:
            mv = float(np.percentile(m, q)) if m.size else float("nan")
            pv = float(np.percentile(p, q)) if p.size else float("nan")
            out[f"{name}_p{q}"] = {"measured": mv, "predicted": pv,
                                   "error": abs(pv - mv) / mv if mv else float("nan")}
    return out


def _rel(pred, meas):
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    ok = meas > 0
    return np.abs(pred[ok] - meas[ok]) / meas[ok]


def step_errors(steps: pd.DataFrame) -> dict:
    out = {"total": _summary(_rel(steps.predicted_s, steps.measured_s))}
    for k in BREAKDOWN_KEYS:
        m = steps[f"measured_{k}"]
        if (m > 0).sum() >= 3:
            out[k] = _summary(_rel(steps[f"predicted_{k}"], m))
    return out


def _summary(e: np.ndarray) -> dict:
    if e.size == 0:
        return {"n": 0}
    return {"n": int(e.size), "median": float(np.median(e)), "p90": float(np.percentile(e, 90))}


def validate(setup, gpu_executor, out: Path, progress: bool = True, idle: bool = True) -> dict:
    from granisim.core.serving_loop import ServingLoop
    from granisim.costmodel.executor import CostExecutor

    out.mkdir(parents=True, exist_ok=True)
    paired = PairedExecutor(gpu_executor, setup.profile, setup.model, idle=idle)
    measured = ServingLoop(setup, paired, progress=progress).run()
    simulated = ServingLoop(setup, CostExecutor(setup.profile, setup.model), progress=progress).run()
    steps = pd.DataFrame(paired.rows)
    steps.to_parquet(out / "steps.parquet", index=False)
    (out / "plans.pkl").write_bytes(pickle.dumps(paired.plans))
    mreq, sreq = requests_frame(measured.records), requests_frame(simulated.records)
    mreq.to_parquet(out / "measured_requests.parquet", index=False)
    sreq.to_parquet(out / "predicted_requests.parquet", index=False)
    m_sum = summarize(mreq, measured.steps.frame(), measured.end_s)
    s_sum = summarize(sreq, simulated.steps.frame(), simulated.end_s)
    e2e = end_to_end(m_sum, s_sum)
    errs = step_errors(steps)
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "scenario": setup.scenario.name, "model": setup.model.name, "profile": setup.profile.name,
        "policy": setup.scenario.policy.name, "seed": setup.scenario.seed,
        "device": str(getattr(gpu_executor, "device", "?")),
        "steps": len(steps), "step_errors": errs, "end_to_end": e2e, "targets": TARGETS,
        "percentile_errors": percentile_errors(mreq, sreq),
        # idle: the engine waited out the gaps between arrivals in wall-clock time (idled_s in all)
        "idle": paired.idle_on, "idled_s": round(paired.idled_s, 3),
    }
    if hasattr(gpu_executor, "stats"):
        report["executor"] = gpu_executor.stats()
    (out / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "validation.md").write_text(_markdown(report))
    _plots(steps, measured, simulated, out)
    return report


def _markdown(r: dict) -> str:
    lines = [f"# Validation: {r['scenario']} ({r['policy']}, {r['model']}, profile {r['profile']})", "",
             f"Date {r['date']}, device {r['device']}, seed {r['seed']}, {r['steps']} steps.", "",
             "## Per step (the same plan, predicted vs measured)", "",
             "| key | n | median error | p90 error |", "| --- | --- | --- | --- |"]
    for k, e in r["step_errors"].items():
        if e.get("n"):
            lines.append(f"| {k} | {e['n']} | {e['median']:.1%} | {e['p90']:.1%} |")
    lines += ["", "## End to end (simulator alone vs real engine)", "",
              "| metric | measured | predicted | error |", "| --- | --- | --- | --- |"]
    for k, e in r["end_to_end"].items():
        lines.append(f"| {k} | {e['measured']:.4g} | {e['predicted']:.4g} | {e['error']:.1%} |")
    lines += ["", "## Latency percentiles (absolute percentage error, BLIS's convention)", "",
              "| latency | measured | predicted | error |", "| --- | --- | --- | --- |"]
    for k, e in r["percentile_errors"].items():
        lines.append(f"| {k} | {e['measured']:.4g} | {e['predicted']:.4g} | {e['error']:.1%} |")
    lines += ["", f"Idle between arrivals: {'on' if r['idle'] else 'off'} ({r['idled_s']:.1f} s).", ""]
    lines += ["", f"Targets: {r['targets']}", ""]
    return "\n".join(lines)


def _plots(steps: pd.DataFrame, measured, simulated, out: Path) -> None:
    from granisim.experiments.plots import cdf_panel, plt, save_figure  # report sets the Agg backend

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    a1.scatter(steps.measured_s * 1e3, steps.predicted_s * 1e3, s=6, alpha=0.6)
    hi = max(steps.measured_s.max(), steps.predicted_s.max()) * 1e3 if len(steps) else 1
    a1.plot([0, hi], [0, hi], "k--", lw=0.8)
    a1.set_xlabel("measured step (ms)")
    a1.set_ylabel("predicted step (ms)")
    a1.set_title("per step, same plan")
    mreq, sreq = requests_frame(measured.records), requests_frame(simulated.records)
    curves = []
    for df, name in ((mreq, "measured"), (sreq, "predicted")):
        done = df[df.status == "completed"]
        curves += [(done.tpot_s.to_numpy(), f"TPOT {name}"), (done.ttft_s.to_numpy(), f"TTFT {name}")]
    cdf_panel(a2, curves, "seconds", fontsize=8)
    save_figure(fig, out / "validation.png")


# ---- a fleet: every replica's real steps priced, per replica and fleet-wide --------------------------

def validate_fleet(scenario, source: str, make_real, out: Path, progress: bool = True) -> dict:
    """``validate`` for a scenario with ``[fleet]``: the fleet runs with ``make_real(setup)`` executors (one per
    replica; granisim.fleet's loop lets them take turns, one step at a time), every step also priced by the cost
    model; the simulator alone runs the same fleet. Per-step and end-to-end errors fleet-wide and per replica
    (``steps.parquet`` and both requests frames carry a ``replica`` column). Replicas do not idle between
    arrivals (a replica's next request depends on the router)."""
    from granisim.fleet.build import simulate_fleet
    from granisim.fleet.outputs import fleet_requests, fleet_steps

    out.mkdir(parents=True, exist_ok=True)

    def paired(setup):
        return PairedExecutor(make_real(setup), setup.profile, setup.model, idle=False, host_gaps=False)

    measured = simulate_fleet(scenario, source, paired, progress)
    simulated = simulate_fleet(scenario, source, None, progress)
    rows, plans = [], []
    for rep in measured.replicas:
        for inc, ex in enumerate(rep.executors):
            rows += [{"replica": rep.index, "incarnation": inc, **r} for r in ex.rows]
            plans += ex.plans
    steps = pd.DataFrame(rows)
    steps.to_parquet(out / "steps.parquet", index=False)
    (out / "plans.pkl").write_bytes(pickle.dumps(plans))
    mreq, sreq = fleet_requests(measured), fleet_requests(simulated)
    mreq.to_parquet(out / "measured_requests.parquet", index=False)
    sreq.to_parquet(out / "predicted_requests.parquet", index=False)
    msteps, ssteps = fleet_steps(measured), fleet_steps(simulated)

    def section(mine_m, mine_s, st_m, st_s, paired_steps) -> dict:
        m_sum = summarize(mine_m, st_m, measured.end_s)
        s_sum = summarize(mine_s, st_s, simulated.end_s)
        return {"steps": len(paired_steps), "requests": int(len(mine_m)), "completed": int(m_sum["completed"]),
                "step_errors": step_errors(paired_steps) if len(paired_steps) else {"total": {"n": 0}},
                "end_to_end": end_to_end(m_sum, s_sum), "percentile_errors": percentile_errors(mine_m, mine_s)}

    fleet = section(mreq, sreq, msteps, ssteps, steps)
    per = []
    for rep in measured.replicas:
        i = rep.index
        own = (lambda f: f[f.replica == i] if len(f) else f)
        per.append({"replica": i, **section(own(mreq), own(sreq), own(msteps), own(ssteps), own(steps))})
    device = next((getattr(ex.real, "device", "?") for rep in measured.replicas for ex in rep.executors), "?")
    base = measured.replicas[0].spec.setup
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "scenario": scenario.name, "model": base.model.name, "profile": base.profile.name,
        "policy": scenario.policy.name, "seed": scenario.seed, "device": str(device),
        "router": measured.router, "num_replicas": len(measured.replicas),
        **fleet, "targets": TARGETS, "idle": False, "idled_s": 0.0, "replicas": per,
    }
    from granisim.validation.fleet_routing import on_measured_routing, same_replica

    report["same_replica"] = same_replica(mreq, sreq)  # how far the two routers agreed
    report["measured_routing"] = on_measured_routing(scenario, source, mreq, progress)
    if Path(source).is_file():  # what `granisim validation fleet-summary` re-runs on the measured routing
        (out / "scenario.toml").write_text(Path(source).read_text())
    (out / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "validation.md").write_text(_fleet_markdown(report))
    return report


def _section_lines(sec: dict) -> list[str]:
    lines = ["| key | n | median error | p90 error |", "| --- | --- | --- | --- |"]
    for k, e in sec["step_errors"].items():
        if e.get("n"):
            lines.append(f"| {k} | {e['n']} | {e['median']:.1%} | {e['p90']:.1%} |")
    lines += ["", "| metric | measured | predicted | error |", "| --- | --- | --- | --- |"]
    for k, e in {**sec["end_to_end"], **sec["percentile_errors"]}.items():
        lines.append(f"| {k} | {e['measured']:.4g} | {e['predicted']:.4g} | {e['error']:.1%} |")
    return lines


def _fleet_markdown(r: dict) -> str:
    lines = [f"# Validation: fleet {r['scenario']} ({r['num_replicas']} replicas, router {r['router']}, "
             f"{r['policy']}, {r['model']}, profile {r['profile']})", "",
             f"Date {r['date']}, device {r['device']}, seed {r['seed']}, {r['steps']} steps "
             f"({r['completed']} of {r['requests']} requests completed).", "",
             "Per step: the same plan, predicted vs measured. End to end: the simulated fleet alone vs the "
             "real one (the router decides from each run's own state, so a request may land elsewhere).", "",
             "## Fleet", ""]
    lines += _section_lines(r)
    for sec in r["replicas"]:
        lines += ["", f"## Replica {sec['replica']} ({sec['steps']} steps, {sec['completed']} of "
                      f"{sec['requests']} requests completed)", ""]
        lines += _section_lines(sec)
    mr = r.get("measured_routing")
    if mr:
        lines += ["", f"## On the real fleet's routing (the simulated router sent {r['same_replica']:.0%} of the "
                      "requests where the real one did)", "",
                  "The simulated fleet again, every request sent where the real router sent it: each replica "
                  "judged on the requests it served.", ""]
        for sec in [{"replica": "fleet", **mr["fleet"]}, *mr["replicas"]]:
            e = {**sec["end_to_end"], **sec["percentile_errors"]}
            lines.append(f"- {'fleet-wide' if sec['replica'] == 'fleet' else 'replica ' + str(sec['replica'])}: "
                         + ", ".join(f"{k} {e[k]['error']:.1%}" for k in E2E_KEYS if k in e))
    lines += ["", "Idle between arrivals: off (fleet).", "", f"Targets: {r['targets']}", ""]
    return "\n".join(lines)
