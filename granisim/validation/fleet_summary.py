"""The one-GPU fleet validation in one table: fleet-wide and per-replica errors of each `granisim validate` run.

    granisim validation fleet-summary RUN_DIR ... --out summary.json [--table summary.md]

Each RUN_DIR is what `granisim validate` writes for a scenario with ``[fleet]``
(granisim.validation.validate.validate_fleet): ``validation.json`` and the measured and predicted requests
(``*_requests.parquet``, with their replica); its machine is the name of RUN_DIR's parent folder. Writes one
record per run x scope (``fleet`` or ``replica``, with its index) x metric, with ``measured``, ``predicted``,
``error`` and, where a metric has a target, ``target`` and ``met`` (the records of ``granisim validation
summary``), and per run ``same_replica``: the share of requests the simulated fleet's router sent to the replica
the real fleet's router chose. Where that is below 1 the replicas served different requests in the two fleets,
so per-replica errors compare different work; the fleet-wide ones do not depend on it. The table gives the
fleet-wide signed errors per run, the routing agreement and how many replicas meet every target.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from granisim.validation.summary import TABLE_METRICS, _fail, _unit_records

LABELS = {"step_median": "per-step median", "throughput_rps": "throughput", "tpot_p50_s": "TPOT p50",
          "tpot_p99_s": "TPOT p99", "ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99"}


def load(run_dir: Path) -> dict:
    path = Path(run_dir) / "validation.json"
    try:
        rep = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        _fail(f"{path}: not a readable validation JSON ({' '.join(str(err).split())[:120]})")
    if not isinstance(rep, dict) or not isinstance(rep.get("replicas"), list) or "end_to_end" not in rep:
        _fail(f"{path}: replicas: not a fleet validation (`granisim validate` on a scenario with [fleet])")
    return rep


def same_replica(run_dir: Path) -> float:
    """The share of requests routed to the same replica by the real fleet and by the simulated one."""
    import pandas as pd

    frames = []
    for side in ("measured", "predicted"):
        path = Path(run_dir) / f"{side}_requests.parquet"
        try:
            frames.append(pd.read_parquet(path, columns=["rid", "replica"]).set_index("rid")["replica"])
        except (OSError, ValueError, KeyError) as err:
            _fail(f"{path}: no requests with their replica ({' '.join(str(err).split())[:120]})")
    m, p = frames
    if set(m.index) != set(p.index):
        _fail(f"{run_dir}: the measured and predicted requests differ ({len(m)} against {len(p)})")
    return float((m == p.reindex(m.index)).mean()) if len(m) else float("nan")


def records(run_dirs: list[Path]) -> list[dict]:
    out = []
    for d in run_dirs:
        rep = load(d)
        base = {"scenario": rep["scenario"], "router": rep["router"], "policy": rep["policy"], "model": rep["model"],
                "profile": rep["profile"], "replicas": rep["num_replicas"], "machine": Path(d).resolve().parent.name,
                "run": Path(d).name, "same_replica": same_replica(d), "date": rep.get("date")}
        scopes = [({"scope": "fleet", "replica": None}, rep)]
        scopes += [({"scope": "replica", "replica": r["replica"]}, r) for r in rep["replicas"]]
        for scope, sec in scopes:
            if sec["step_errors"]["total"].get("n", 0) == 0:  # a replica that served nothing
                continue
            out += _unit_records({**base, **scope}, sec["step_errors"], sec["end_to_end"],
                                 sec.get("percentile_errors", {}))
    return out


def _cell(r: dict | None) -> str:
    if r is None or r["error"] is None:
        return "-"
    m = r["metric"]
    text = f"{r['error']:.1%}" if m == "step_median" else f"{r['predicted'] / r['measured'] - 1.0:+.1%}"
    return text if r["met"] in (True, None) else f"**{text}**"


def table(recs: list[dict]) -> str:
    """Markdown: one row per run, fleet-wide signed errors ((predicted - measured) / measured; the per-step median
    is of |error|), misses in bold, and the replicas meeting every target; then the counts."""
    runs: dict[tuple, dict] = {}
    for r in recs:
        key = (r["machine"], r["run"])
        runs.setdefault(key, {"meta": r, "fleet": {}, "replicas": {}})
        if r["scope"] == "fleet":
            runs[key]["fleet"][r["metric"]] = r
        elif r["met"] is not None:
            ok = runs[key]["replicas"].setdefault(r["replica"], True)
            runs[key]["replicas"][r["replica"]] = ok and r["met"]
    lines = ["| machine | scenario | router | " + " | ".join(LABELS[m] for m in TABLE_METRICS)
             + " | requests on the simulated replica | replicas meeting every target |",
             "| --- | --- | --- |" + " ---: |" * (len(TABLE_METRICS) + 2)]
    met = checks = checks_met = 0
    for (machine, _), run in sorted(runs.items()):
        fl = run["fleet"]
        judged = [fl[m] for m in TABLE_METRICS if m in fl and fl[m]["met"] is not None]
        checks += len(judged)
        checks_met += sum(r["met"] for r in judged)
        met += all(r["met"] for r in judged)
        reps = run["replicas"]
        lines.append(f"| {machine} | {run['meta']['scenario']} | {run['meta']['router']} | "
                     + " | ".join(_cell(fl.get(m)) for m in TABLE_METRICS)
                     + f" | {run['meta']['same_replica']:.0%} | {sum(reps.values())} of {len(reps)} |")
    lines.append(f"\nFleet-wide: {met} of {len(runs)} runs meet every target; {checks_met} of {checks} target checks "
                 "are met.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="granisim validation fleet-summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--table", type=Path, help="also write the fleet-wide table (markdown) here")
    args = ap.parse_args(argv)
    recs = records(args.runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from granisim.validation.validate import TARGETS

    args.out.write_text(json.dumps({"targets": TARGETS, "records": recs}, indent=1) + "\n")
    text = table(recs)
    if args.table:
        args.table.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
