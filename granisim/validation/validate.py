"""Predicted vs measured: the same scenario and seed through the real engine and the simulator.

``validate(setup, gpu_executor, out)``:

1. runs the engine loop with the GPU executor; every executed plan is also priced by the
   cost model (the *same* plan), giving per-step predicted vs measured pairs per
   breakdown key — the prediction error of the cost model free of any scheduling drift;
2. runs the simulator alone (cost executor) on the same scenario and seed, giving the
   end-to-end predictions (throughput, TTFT, TPOT percentiles) to set against the
   measured run's.

Writes ``validation.json``, ``validation.md``, ``steps.parquet`` and plots into ``out``.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.costmodel import step_cost
from granisim.core.metrics import BREAKDOWN_KEYS, requests_frame, summarize
from granisim.core.contract import BatchPlan, StepResult

E2E_KEYS = ("throughput_rps", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
TARGETS = {"step_median": 0.03, "throughput_rps": 0.05, "tpot_p50_s": 0.05, "tpot_p99_s": 0.05,
           "ttft_p99_s": 0.10}


class PairedExecutor:
    """Runs the real executor and prices the same plan with the cost model."""

    def __init__(self, real, profile, model):
        self.real, self.profile, self.model = real, profile, model
        self.needs_layouts = real.needs_layouts
        self.max_steps_per_plan = real.max_steps_per_plan
        self.rows: list[dict] = []
        self.plans: list[BatchPlan] = []  # without slot data: enough to re-price the run with another profile

    def execute(self, plan: BatchPlan) -> StepResult:
        measured = self.real.execute(plan)
        self.plans.append(replace(plan, requests=tuple(replace(r, layout=None, new_slots=None, input_tokens=None)
                                                       for r in plan.requests)))
        row = {"step": plan.step, "batch": len(plan.requests), "tokens": plan.num_tokens,
               "prefill": any(r.is_prefill for r in plan.requests), **_columns("measured", measured)}
        self.rows.append({**row, **_columns("predicted", step_cost(plan, self.profile, self.model))})
        return measured


def _columns(side: str, r: StepResult) -> dict:
    return {f"{side}_s": r.duration_s, **{f"{side}_{k}": r.breakdown.get(k, 0.0) for k in BREAKDOWN_KEYS}}


def reprice(steps: pd.DataFrame, plans: list[BatchPlan], profile, model) -> pd.DataFrame:
    """A measured run's steps with the predictions of another profile (the run's stored plans)."""
    priced = pd.DataFrame([_columns("predicted", step_cost(p, profile, model)) for p in plans], index=steps.index)
    return steps.assign(**priced)


def end_to_end(measured: dict, predicted: dict) -> dict:
    """Relative error of the simulator's summary against the real engine's, per end-to-end metric."""
    return {k: {"measured": measured[k], "predicted": predicted[k],
                "error": abs(predicted[k] - measured[k]) / measured[k] if measured[k] else float("nan")}
            for k in E2E_KEYS}


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


def validate(setup, gpu_executor, out: Path, progress: bool = True) -> dict:
    from granisim.core.serving_loop import ServingLoop
    from granisim.costmodel.executor import CostExecutor

    out.mkdir(parents=True, exist_ok=True)
    paired = PairedExecutor(gpu_executor, setup.profile, setup.model)
    measured = ServingLoop(setup, paired, progress=progress).run()
    simulated = ServingLoop(setup, CostExecutor(setup.profile, setup.model), progress=progress).run()
    steps = pd.DataFrame(paired.rows)
    steps.to_parquet(out / "steps.parquet", index=False)
    (out / "plans.pkl").write_bytes(pickle.dumps(paired.plans))
    requests_frame(measured.records).to_parquet(out / "measured_requests.parquet", index=False)
    m_sum = summarize(requests_frame(measured.records), measured.steps.frame(), measured.end_s)
    s_sum = summarize(requests_frame(simulated.records), simulated.steps.frame(), simulated.end_s)
    e2e = end_to_end(m_sum, s_sum)
    errs = step_errors(steps)
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "scenario": setup.scenario.name, "model": setup.model.name, "profile": setup.profile.name,
        "policy": setup.scenario.policy.name, "seed": setup.scenario.seed,
        "device": str(getattr(gpu_executor, "device", "?")),
        "steps": len(steps), "step_errors": errs, "end_to_end": e2e, "targets": TARGETS,
    }
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
    lines += ["", f"Targets: {r['targets']}", ""]
    return "\n".join(lines)


def _plots(steps: pd.DataFrame, measured, simulated, out: Path) -> None:
    from granisim.experiments.plots import plot_cdf, plt, save_figure  # report sets the Agg backend

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    a1.scatter(steps.measured_s * 1e3, steps.predicted_s * 1e3, s=6, alpha=0.6)
    hi = max(steps.measured_s.max(), steps.predicted_s.max()) * 1e3 if len(steps) else 1
    a1.plot([0, hi], [0, hi], "k--", lw=0.8)
    a1.set_xlabel("measured step (ms)")
    a1.set_ylabel("predicted step (ms)")
    a1.set_title("per step, same plan")
    mreq, sreq = requests_frame(measured.records), requests_frame(simulated.records)
    for df, name in ((mreq, "measured"), (sreq, "predicted")):
        done = df[df.status == "completed"]
        plot_cdf(a2, done.tpot_s.to_numpy(), f"TPOT {name}")
        plot_cdf(a2, done.ttft_s.to_numpy(), f"TTFT {name}")
    a2.set_xscale("log")
    a2.set_xlabel("seconds")
    a2.set_ylabel("CDF")
    a2.legend(fontsize=8)
    save_figure(fig, out / "validation.png")
