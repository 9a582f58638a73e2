"""The one-GPU fleet validation in one table: fleet-wide and per-replica errors of each `granisim validate` run.

    granisim validation fleet-summary RUN_DIR ... --out summary.json [--table summary.md]

Each RUN_DIR is what `granisim validate` writes for a scenario with ``[fleet]``
(granisim.validation.validate.validate_fleet): ``validation.json`` and the measured and predicted requests
(``*_requests.parquet``, with their replica); a run whose ``validation.json`` lacks the re-run on the real routing
(made before validate did it) needs its ``scenario.toml`` beside them. Its machine is the name of RUN_DIR's
parent folder. Writes one record per run x routing x scope (``fleet`` or ``replica``, with its index) x metric, with
``measured``, ``predicted``, ``error`` and, where a metric has a target, ``target`` and ``met`` (the records of
``granisim validation summary``). Routing ``own``: the simulated fleet routed by its own router, as validated;
``measured``: the simulated fleet run again on the real fleet's routing (granisim.validation.fleet_routing), so
that each replica is judged on the requests it served (the per-step median is the run's own in both: it pairs
the real steps with their prices). ``same_replica`` is the share of requests the simulated router sent where the
real one did; below 1 the own-routing per-replica errors compare different work. The table gives the fleet-wide
signed errors per run, the routing agreement and how many replicas meet every target under each routing.
"""
from __future__ import annotations

import json
from pathlib import Path

from granisim.validation.fleet_routing import on_measured_routing, same_replica
from granisim.validation.summary import TABLE_METRICS, _fail, _unit_records, error_text, records_json
from granisim.validation.validate import TARGETS
from granisim.config.files import OneLineParser, one_line

LABELS = {"step_median": "per-step median", "throughput_rps": "throughput", "tpot_p50_s": "TPOT p50",
          "tpot_p99_s": "TPOT p99", "ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99"}


def load(run_dir: Path) -> dict:
    path = Path(run_dir) / "validation.json"
    try:
        rep = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        _fail(f"{path}: not a readable validation JSON ({one_line(err)})")
    if not isinstance(rep, dict) or not isinstance(rep.get("replicas"), list) or not rep["replicas"] \
            or "end_to_end" not in rep:
        _fail(f"{path}: replicas: not a fleet validation (`granisim validate` on a scenario with [fleet])")
    return rep


def _requests(run_dir: Path, side: str):
    import pandas as pd

    path = Path(run_dir) / f"{side}_requests.parquet"
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as err:
        _fail(f"{path}: no requests with their replica ({one_line(err)})")
    missing = {"rid", "replica"} - set(frame.columns)
    if missing:
        _fail(f"{path}: no requests with their replica (no column {', '.join(sorted(missing))})")
    return frame


def records(run_dirs: list[Path]) -> list[dict]:
    from granisim.config.scenario import ScenarioError, load_scenario

    out, seen = [], {}
    for d in run_dirs:
        key = (Path(d).resolve().parent.name, Path(d).name)  # the table's row: machine (the parent folder), run
        if key in seen:
            _fail(f"{d}: the same machine and run as {seen[key]} ({'/'.join(key)}); give each run once (a run "
                  f"re-scored with another profile goes in a folder of its own machine name)")
        seen[key] = d
        rep = load(d)
        measured, predicted = _requests(d, "measured"), _requests(d, "predicted")
        if set(measured.rid) != set(predicted.rid):
            _fail(f"{d}: the measured and predicted requests differ ({len(measured)} against {len(predicted)})")
        routed = rep.get("measured_routing")
        if routed is None:  # a run from before `granisim validate` did the re-run: do it from its scenario
            path = Path(d) / "scenario.toml"
            try:
                scenario = load_scenario(path)
            except ScenarioError as err:
                _fail(str(err))
            routed = on_measured_routing(scenario, str(path), measured)
        try:
            out += _run_records(d, rep, measured, predicted, routed)
        except (KeyError, TypeError, AttributeError) as err:  # a hand-edited or truncated report
            what = f"field {err.args[0]!r} missing" if isinstance(err, KeyError) else one_line(err)
            _fail(f"{Path(d) / 'validation.json'}: {what}: not a fleet validation of `granisim validate`")
    return out


def _run_records(d: Path, rep: dict, measured, predicted, routed: dict) -> list[dict]:
    """One run's records: fleet-wide and per replica, on its own routing and on the real one."""
    out = []
    base = {"scenario": rep["scenario"], "router": rep["router"], "policy": rep["policy"], "model": rep["model"],
            "profile": rep["profile"], "replicas": rep["num_replicas"], "machine": Path(d).resolve().parent.name,
            "run": Path(d).name, "same_replica": same_replica(measured, predicted), "date": rep.get("date")}
    own = {r["replica"]: r for r in rep["replicas"]}
    scopes = [({"routing": "own", "scope": "fleet", "replica": None}, rep, rep)]
    scopes += [({"routing": "own", "scope": "replica", "replica": i}, r, r) for i, r in own.items()]
    scopes += [({"routing": "measured", "scope": "fleet", "replica": None}, rep, routed["fleet"])]
    scopes += [({"routing": "measured", "scope": "replica", "replica": r["replica"]}, own[r["replica"]], r)
               for r in routed["replicas"] if r["replica"] in own]
    for scope, steps, sec in scopes:
        if steps["step_errors"]["total"].get("n", 0) == 0:  # a replica that served nothing
            continue
        out += _unit_records({**base, **scope}, steps["step_errors"], sec["end_to_end"],
                             sec.get("percentile_errors", {}))
    return out


def _cell(r: dict | None) -> str:
    text = None if r is None or r["error"] is None else error_text(r)
    if text is None:
        return "-"
    return text if r["met"] in (True, None) else f"**{text}**"


def table(recs: list[dict]) -> str:
    """Markdown: one row per run, fleet-wide signed errors ((predicted - measured) / measured; the per-step median
    is of |error|), misses in bold, and the replicas meeting every target; then the counts."""
    runs: dict[tuple, dict] = {}
    for r in recs:
        key = (r["machine"], r["run"])
        run = runs.setdefault(key, {"meta": r, "fleet": {}, "fleet_measured": {}, "own": {}, "measured": {}})
        if r["scope"] == "fleet":
            run["fleet" if r["routing"] == "own" else "fleet_measured"][r["metric"]] = r
        elif r["met"] is not None:
            reps = run[r["routing"]]
            reps[r["replica"]] = reps.get(r["replica"], True) and r["met"]
    lines = ["| machine | scenario | router | " + " | ".join(LABELS[m] for m in TABLE_METRICS)
             + " | requests on the simulated replica | replicas meeting every target | the same, on the real routing |",
             "| --- | --- | --- |" + " ---: |" * (len(TABLE_METRICS) + 3)]
    met = checks = checks_met = met_real = 0
    for (machine, _), run in sorted(runs.items()):
        met_real += all(r["met"] for r in run["fleet_measured"].values() if r["met"] is not None)
        fl = run["fleet"]
        judged = [fl[m] for m in TABLE_METRICS if m in fl and fl[m]["met"] is not None]
        checks += len(judged)
        checks_met += sum(r["met"] for r in judged)
        met += all(r["met"] for r in judged)
        own, real = run["own"], run["measured"]
        lines.append(f"| {machine} | {run['meta']['scenario']} | {run['meta']['router']} | "
                     + " | ".join(_cell(fl.get(m)) for m in TABLE_METRICS)
                     + f" | {run['meta']['same_replica']:.0%} | {sum(own.values())} of {len(own)} | "
                       f"{sum(real.values())} of {len(real)} |")
    lines.append(f"\nFleet-wide: {met} of {len(runs)} runs meet every target; {checks_met} of {checks} target checks "
                 f"are met; on the real fleet's routing, {met_real} of {len(runs)} runs meet every target.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation fleet-summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--table", type=Path, help="also write the fleet-wide table (markdown) here")
    args = ap.parse_args(argv)
    recs = records(args.runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(records_json(recs, targets=TARGETS))
    text = table(recs)
    if args.table:
        args.table.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
