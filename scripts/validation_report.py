"""Validation report from a real-engine run (``scripts/engine_h200.py validate --out RUN``), no GPU needed.

    python scripts/validation_report.py RUN --out reports/validation --profile-out granisim/profiles/h200.json

For every workload of the run: the errors as measured (the microbenchmark profile), then the
engine-calibrated model (granisim.calibration.engine) fitted on the OTHER workloads only
(leave one workload out): per-step errors by re-pricing the run's stored plans, end-to-end
errors by re-running the simulator alone. The fit on all workloads goes into --profile-out.
"""
from __future__ import annotations

import argparse
import json
import pickle
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from engine_h200 import VALIDATION, _scenario  # noqa: E402
from granisim.calibration.engine import fit, kv_tokens_read, with_engine  # noqa: E402
from granisim.engine import Engine  # noqa: E402
from granisim.executor import CostExecutor  # noqa: E402
from granisim.hardware import Source  # noqa: E402
from granisim.metrics import requests_frame, summarize  # noqa: E402
from granisim.simulate import prepare  # noqa: E402
from granisim.validate import TARGETS, end_to_end, reprice, step_errors  # noqa: E402


def _setup(name: str, requests: int, profile: str):
    extra = VALIDATION[name]
    extra = {**extra, "workload": {**extra["workload"], "num_requests": requests}}
    return prepare(_scenario(extra, profile))


def _e2e(setup, measured: dict) -> dict:
    res = Engine(setup, CostExecutor(setup.profile, setup.model), progress=False).run()
    return end_to_end({k: v["measured"] for k, v in measured.items()},
                      summarize(requests_frame(res.records), res.steps.frame(), res.end_s))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile-out", type=Path)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--profile", default="h200")
    args = ap.parse_args()
    names = [n for n in VALIDATION if (args.run / n / "steps.parquet").exists()]
    steps = {n: pd.read_parquet(args.run / n / "steps.parquet") for n in names}
    plans = {n: pickle.loads((args.run / n / "plans.pkl").read_bytes()) for n in names}
    for n in names:
        steps[n]["kv_tokens"] = [kv_tokens_read(p) for p in plans[n]]
    raw = {n: json.loads((args.run / f"validation_{n}.json").read_text()) for n in names}
    meta = {k: (args.run.parent / f"{k}.txt").read_text().strip() for k in ("commit", "versions")
            if (args.run.parent / f"{k}.txt").exists()}
    source = Source("measured", date=raw[names[0]]["date"],
                    command=f"scripts/engine_h200.py validate (H200, commit {meta.get('commit', '?')}); "
                            f"python scripts/validation_report.py RUN --profile-out ...",
                    note="granisim.calibration.engine fit on the real engine's validation runs "
                         f"({', '.join(names)}): key time = scale * model + offset; overhead per step + per request")
    report = {"run": {"date": raw[names[0]]["date"], **meta, "device": raw[names[0]]["device"]},
              "targets": TARGETS, "workloads": {}}
    frames = []
    for n in names:
        setup = _setup(n, args.requests, args.profile)
        vals = fit([steps[o] for o in names if o != n])
        prof = with_engine(setup.profile, vals, source)
        cal = reprice(steps[n], plans[n], prof, setup.model)
        cal["workload"] = n
        frames.append(cal)
        report["workloads"][n] = {
            "steps": int(len(cal)), "executor": raw[n].get("executor"),
            "as_measured": {"step_errors": raw[n]["step_errors"], "end_to_end": raw[n]["end_to_end"]},
            "engine_calibrated_held_out": {"fitted_on": [o for o in names if o != n], "coefficients": vals,
                                           "step_errors": step_errors(cal),
                                           "end_to_end": _e2e(replace(setup, profile=prof), raw[n]["end_to_end"])}}
        print(n, json.dumps(report["workloads"][n]["engine_calibrated_held_out"]["step_errors"]["total"]))
    report["fit_all"] = fit(list(steps.values()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "h200.json").write_text(json.dumps(report, indent=2) + "\n")
    pd.concat(frames).to_parquet(args.out / "h200_steps.parquet", index=False)
    _plot(pd.concat(frames), args.out / "h200.png")
    if args.profile_out:
        doc = json.loads(args.profile_out.read_text())
        for name, v in report["fit_all"].items():
            doc["coefficients"][name] = {"value": v, "unit": "" if name.endswith(".scale") else "s",
                                         "source": {"kind": "measured", "date": source.date, "command": source.command,
                                                    "note": source.note}}
        args.profile_out.write_text(json.dumps(doc, indent=2) + "\n")


def _plot(df: pd.DataFrame, path: Path) -> None:
    from granisim.report import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for n, g in df.groupby("workload"):
        axes[0].scatter(g.measured_s * 1e3, g.predicted_s * 1e3, s=4, alpha=0.5, label=n)
        axes[1].hist(((g.predicted_s - g.measured_s) / g.measured_s).clip(-0.5, 0.5), bins=60, alpha=0.5, label=n)
    hi = float(max(df.measured_s.max(), df.predicted_s.max()) * 1e3)
    axes[0].plot([0.1, hi], [0.1, hi], "k--", lw=0.8)
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("measured step (ms)")
    axes[0].set_ylabel("predicted step (ms), engine-calibrated, held out")
    axes[1].set_xlabel("relative step error (clipped to +-50%)")
    for a in axes:
        a.legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
