"""A ``granisim validate`` run judged again with the current cost model and a profile, no GPU needed.

    granisim validation rescore RUN [RUN ...] [--scenario TOML] [--profile NAME] [--out JSON]

Each RUN is the folder ``granisim validate`` wrote (``steps.parquet``, ``plans.pkl``,
``measured_requests.parquet``, ``validation.json``): its stored plans are re-priced step by step and the simulator is run
alone on the scenario (``RUN/../scenarios/*_<RUN name>.toml`` as ``reports/host_tier/run_validation.sh``
lays them out, else ``--scenario``) with ``--profile`` (default: the scenario's own), so a profile refit
needs no new GPU run. Prints one row a run (per-step median, throughput, TTFT and TPOT errors) and
writes the records to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from granisim.validation.plans import load_plans

METRICS = ("throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


def _scenario_of(run: Path) -> Path | None:
    found = sorted((run.parent / "scenarios").glob(f"*_{run.name}.toml"))
    return found[0] if len(found) == 1 else None


def rescore(run: Path, scenario: Path, profile: str | None = None) -> dict:
    """Per-step and end-to-end errors of ``run`` with the current cost model (``profile`` if given)."""
    from granisim.config.scenario import load_scenario
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate
    from granisim.validation.validate import end_to_end, percentile_errors, reprice, step_errors

    sc = load_scenario(scenario)
    if profile:
        sc = sc.with_changes(**{"hardware.profile": profile})
    setup = prepare(sc)
    steps = reprice(pd.read_parquet(run / "steps.parquet"), load_plans(run / "plans.pkl"), setup.profile,
                    setup.model)
    mreq = pd.read_parquet(run / "measured_requests.parquet")
    # what the engine measured does not depend on the profile: the run's own figures
    measured = {k: v["measured"] for k, v in json.loads((run / "validation.json").read_text())["end_to_end"].items()}
    sim = simulate(setup, progress=False)
    sreq = requests_frame(sim.records)
    predicted = summarize(sreq, sim.steps.frame(), sim.end_s)
    return {"run": str(run), "scenario": str(scenario), "profile": setup.profile.name, "policy": sc.policy.name,
            "steps": len(steps), "step_errors": step_errors(steps), "end_to_end": end_to_end(measured, predicted),
            "percentile_errors": percentile_errors(mreq, sreq)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="granisim validation rescore", description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--scenario", type=Path, help="the scenario every RUN ran (default: found beside each run)")
    ap.add_argument("--profile", help="price with this profile (default: the scenario's)")
    ap.add_argument("--out", type=Path, help="write the records here (JSON)")
    args = ap.parse_args(argv)
    records = []
    print("| run | policy | steps | per-step median | " + " | ".join(METRICS) + " |")
    print("| --- | --- | ---: | ---: |" + " ---: |" * len(METRICS))
    for run in args.runs:
        toml = args.scenario or _scenario_of(run)
        for need in (run / "steps.parquet", run / "plans.pkl", run / "measured_requests.parquet",
                     run / "validation.json", toml):
            if need is None or not Path(need).is_file():
                hint = " (granisim validation rebuild-plans RUN SCENARIO makes it)" if need == run / "plans.pkl" else ""
                print(f"{run}: no {need or 'scenario beside it (give --scenario)'}{hint}", file=sys.stderr)
                return 2
        r = rescore(run, toml, args.profile)
        records.append(r)
        e = r["end_to_end"]
        cells = [f"{e[m]['measured']:.4g} / {e[m]['predicted']:.4g} ({e[m]['predicted'] / e[m]['measured'] - 1:+.1%})"
                 for m in METRICS]
        print(f"| {run} | {r['policy']} | {r['steps']} | {r['step_errors']['total']['median']:.1%} | "
              + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(json.dumps(records, indent=2) + "\n")
    return 0
