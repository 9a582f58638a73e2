"""A ``granisim validate`` run judged again with the current cost model and a profile, no GPU needed.

    granisim validation rescore RUN [RUN ...] [--scenario TOML] [--profile NAME] [--out JSON]

Each RUN is the folder ``granisim validate`` wrote (``steps.parquet``, ``plans.pkl``,
``measured_requests.parquet``, ``validation.json``): its stored plans are re-priced step by step and the simulator is run
alone on the scenario (``RUN/../scenarios/*_<RUN name>.toml`` as ``reports/host_tier/run_validation.sh``
lays them out, else ``--scenario``) with ``--profile`` (default: the scenario's own), so a profile refit
needs no new GPU run. Prints one row a run (per-step median, throughput, TTFT and TPOT errors) and
writes the records to ``--out``.

A fleet run (a scenario with ``[fleet]``; its ``plans.pkl`` from ``granisim validation rebuild-plans``) needs
``--fleet-out DIR``: its steps are re-priced, the simulated fleet is run again with the profile, on its own router
and on the real fleet's routing, and DIR/<machine>/<run>/ gets what ``granisim validate`` writes for a fleet
(``validation.json``, ``validation.md``, both requests frames), for ``granisim validation fleet-summary DIR/*/*/``.
What the engine measured is the run's own (its ``validation.json``).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from granisim.validation.plans import load_plans
from granisim.validation.summary import signed_error
from granisim.config.files import OneLineParser, one_line

METRICS = ("throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


def _scenario_of(run: Path) -> Path | None:
    """The scenario a run ran: RUN/../scenarios/*_<RUN name>.toml (run_validation.sh's layout), else
    RUN/scenario.toml (what granisim validate writes); None when neither is there."""
    found = sorted((run.parent / "scenarios").glob(f"*_{run.name}.toml"))
    if len(found) == 1:
        return found[0]
    return run / "scenario.toml" if (run / "scenario.toml").is_file() else None


def _run_report(run: Path, fleet: bool = False) -> dict:
    """The run's own validation.json: what the engine measured (a ValueError naming the file where it is not
    a validation report, or for a fleet run not a fleet's)."""
    path = run / "validation.json"
    try:
        report = json.loads(path.read_text())
        for section in [report] + (report["replicas"] if fleet else []):
            for v in section["end_to_end"].values():
                v["measured"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        what = "a fleet validation report (`granisim validate` on a scenario with [fleet])" if fleet \
            else "a validation report"
        raise ValueError(f"{path}: not {what} with measured end_to_end figures "
                         f"({one_line(err)})") from None
    return report


def _same_requests(scenario: Path, run: Path, measured: pd.DataFrame, simulated: pd.DataFrame) -> None:
    """A ValueError unless ``scenario`` makes the first turns ``run`` measured (their ids and prompt lengths: a
    later turn's prompt holds the earlier turns' outputs, so only the first turns do not depend on the timing)."""
    def first_turns(df: pd.DataFrame) -> list:
        return sorted(map(tuple, df.loc[df.turn == 0, ["rid", "prompt_len"]].to_numpy().tolist()))

    want, got = first_turns(measured), first_turns(simulated)
    if want != got:
        raise ValueError(f"{scenario}: not the scenario {run} ran: its {len(got)} first-turn requests differ from "
                         f"the {len(want)} the run measured (ids or prompt lengths)")


def rescore(run: Path, scenario: Path, profile: str | None = None) -> dict:
    """Per-step and end-to-end errors of ``run`` with the current cost model (``profile`` if given)."""
    from granisim.config.scenario import load_scenario
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate
    from granisim.validation.validate import end_to_end, percentile_errors, reprice, step_errors

    sc = load_scenario(scenario)
    if profile:
        sc = sc.with_changes(**{"hardware.profile": profile})
    setup = prepare(sc, str(scenario))
    steps, plans = pd.read_parquet(run / "steps.parquet"), load_plans(run / "plans.pkl")
    if len(steps) != len(plans):
        raise ValueError(f"{run}: {len(plans)} plans for {len(steps)} steps")
    steps = reprice(steps, plans, setup.profile, setup.model)
    mreq = pd.read_parquet(run / "measured_requests.parquet")
    # what the engine measured does not depend on the profile: the run's own figures
    measured = {k: v["measured"] for k, v in _run_report(run)["end_to_end"].items()}
    sim = simulate(setup, progress=False)
    sreq = requests_frame(sim.records)
    _same_requests(scenario, run, mreq, sreq)
    predicted = summarize(sreq, sim.steps.frame(), sim.end_s)
    return {"run": str(run), "scenario": str(scenario), "profile": setup.profile.name, "policy": sc.policy.name,
            "steps": len(steps), "step_errors": step_errors(steps), "end_to_end": end_to_end(measured, predicted),
            "percentile_errors": percentile_errors(mreq, sreq)}


def rescore_fleet(run: Path, scenario: Path, out: Path, profile: str | None = None) -> dict:
    """A fleet validation run (``granisim validate`` on a scenario with ``[fleet]``) judged again with the current
    cost model and ``profile``: every step re-priced (fleet-wide and per replica), the simulated fleet run again on
    its own router and on the real routing; the measured figures are the run's own. Writes ``validation.json``,
    ``validation.md`` and both requests frames into ``out`` and returns the report."""
    from granisim.config.scenario import load_scenario
    from granisim.fleet.build import replica_specs, simulate_fleet
    from granisim.fleet.outputs import fleet_requests, fleet_steps
    from granisim.core.metrics import summarize
    from granisim.validation.fleet_routing import on_measured_routing, same_replica
    from granisim.validation.validate import _fleet_markdown, end_to_end, percentile_errors, reprice, step_errors

    sc = load_scenario(scenario)
    if sc.fleet is None:
        raise ValueError(f"{scenario}: not a fleet scenario (no [fleet])")
    if profile:
        sc = sc.with_changes(**{"hardware.profile": profile})
    old = _run_report(run, fleet=True)
    steps, plans = pd.read_parquet(run / "steps.parquet"), load_plans(run / "plans.pkl")
    if len(steps) != len(plans):
        raise ValueError(f"{run}: {len(plans)} plans for {len(steps)} steps")
    specs = replica_specs(sc, str(scenario))
    parts = []
    for k, spec in enumerate(specs):  # each replica's steps with its own profile and model
        mine = (steps.replica == k).to_numpy()
        if mine.any():
            parts.append(reprice(steps[mine], [p for p, m in zip(plans, mine) if m], spec.setup.profile,
                                 spec.setup.model))
    steps = pd.concat(parts).sort_index() if parts else steps
    simulated = simulate_fleet(sc, str(scenario), None, progress=False)
    mreq = pd.read_parquet(run / "measured_requests.parquet")
    sreq, ssteps = fleet_requests(simulated), fleet_steps(simulated)
    _same_requests(scenario, run, mreq, sreq)

    def section(before: dict, m, s, st, paired) -> dict:
        measured = {k: v["measured"] for k, v in before["end_to_end"].items()}
        return {"steps": len(paired), "requests": before["requests"], "completed": before["completed"],
                "step_errors": step_errors(paired) if len(paired) else {"total": {"n": 0}},
                "end_to_end": end_to_end(measured, summarize(s, st, simulated.end_s)) if measured else {},
                "percentile_errors": percentile_errors(m, s)}

    def own(frame, i):
        return frame[frame.replica == i] if len(frame) else frame

    report = {**old, "profile": specs[0].setup.profile.name, "rescored_from": str(run),
              "rescored": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              **section(old, mreq, sreq, ssteps, steps),
              "replicas": [{"replica": r["replica"], **section(r, own(mreq, r["replica"]), own(sreq, r["replica"]),
                                                               own(ssteps, r["replica"]), own(steps, r["replica"]))}
                           for r in old["replicas"]]}
    report["same_replica"] = same_replica(mreq, sreq)
    report["measured_routing"] = on_measured_routing(sc, str(scenario), mreq)
    out.mkdir(parents=True, exist_ok=True)
    mreq.to_parquet(out / "measured_requests.parquet", index=False)
    sreq.to_parquet(out / "predicted_requests.parquet", index=False)
    (out / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "validation.md").write_text(_fleet_markdown(report))
    return report


def _signed(e: dict) -> str:
    err = signed_error(e)
    return "-" if err is None else f"{err:+.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="granisim validation rescore", description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--scenario", type=Path, help="the scenario every RUN ran (default: found beside each run)")
    ap.add_argument("--profile", help="price with this profile (default: the scenario's)")
    ap.add_argument("--out", type=Path, help="write the records here (JSON)")
    ap.add_argument("--fleet-out", type=Path, help="fleet runs: write each one's re-scored run folder under "
                    "FLEET_OUT/<machine>/<run>/ (for granisim validation fleet-summary)")
    args = ap.parse_args(argv)
    records, tomls = [], {}
    for run in args.runs:  # every run's files first: a missing one is an error before any output
        toml = tomls[run] = args.scenario or _scenario_of(run)
        for need in (run / "steps.parquet", run / "plans.pkl", run / "measured_requests.parquet",
                     run / "validation.json", toml):
            if need is None or not Path(need).is_file():
                hint = " (granisim validation rebuild-plans RUN SCENARIO makes it)" if need == run / "plans.pkl" else ""
                print(f"error: {run}: no {need or 'scenario beside it (give --scenario)'}{hint}", file=sys.stderr)
                return 2
    print("| run | policy | steps | per-step median | " + " | ".join(METRICS) + " |")
    print("| --- | --- | ---: | ---: |" + " ---: |" * len(METRICS))
    for run in args.runs:
        toml = tomls[run]
        if args.fleet_out:
            out = args.fleet_out / run.resolve().parent.name / run.name
            try:
                r = rescore_fleet(run, toml, out, args.profile)
            except ValueError as err:
                print(f"error: {run}: {one_line(err, None)}", file=sys.stderr)
                return 2
            records.append(r)
            print(f"| {run} | {r['policy']} | {r['steps']} | {r['step_errors']['total']['median']:.1%} | "
                  + " | ".join(_signed(r["end_to_end"][m]) for m in METRICS) + f" | -> {out}")
            continue
        r = rescore(run, toml, args.profile)
        records.append(r)
        e = r["end_to_end"]
        cells = [f"{e[m]['measured']:.4g} / {e[m]['predicted']:.4g} ({_signed(e[m])})" for m in METRICS]
        print(f"| {run} | {r['policy']} | {r['steps']} | {r['step_errors']['total']['median']:.1%} | "
              + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(json.dumps(records, indent=2) + "\n")
    return 0
