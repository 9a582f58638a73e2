"""A candidate profile judged on every unit of several machines' runs, beside another profile's summary.

    granisim validation judge PROFILE RAW/validation/run{G1,H1,...} --out DIR [--jobs 2]
        [--against reports/validation/summary.json]

For every run folder and every (policy, model) with units in it, ``granisim validation report RUN --policy P
--model M --check-profile PROFILE`` (re-priced step by step and re-simulated, no GPU) into DIR/<run>/<policy>-<model>/;
pairs already there are kept (run it again to resume). Then DIR/summary.json and DIR/summary.md as ``granisim
validation summary --reports`` writes them, and with ``--against`` (another summary, e.g. the shipped profile's) the
runs both judged: how many meet every target under each, and which runs one profile passes and the other fails
(DIR/compare.md). A profile is only worth shipping if it wins on machines its fit never saw.
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path

from granisim.validation.clock_term import policy_models, units_folder
from granisim.validation.summary import report_records, run_checks, summary_json, tables
from granisim.config.files import OneLineParser, one_line


def _report(job: tuple[str, str, str, str, str]) -> str:
    """One `granisim validation report` (a worker process): '' or the one-line reason it could not run."""
    from granisim.validation.report import main

    run, policy, model, out, profile = job
    try:
        main([run, "--policy", policy, "--model", model, "--out", out, "--check-profile", profile])
    except (ValueError, OSError) as err:
        return one_line(err, None)
    return ""


def compare(candidate: list[dict], against: list[dict]) -> dict:
    """Over the runs both judged: runs meeting every target and checks met under each, and the runs that only one
    passes (pure)."""
    a, b = run_checks(candidate), run_checks(against)
    both = sorted(set(a) & set(b))

    def tally(checks: dict) -> dict:
        return {"runs_met": sum(all(checks[k]) for k in both), "checks_met": sum(sum(checks[k]) for k in both),
                "checks": sum(len(checks[k]) for k in both)}

    return {"runs": len(both), "candidate": tally(a), "against": tally(b),
            "gained": [list(k) for k in both if all(a[k]) and not all(b[k])],
            "lost": [list(k) for k in both if all(b[k]) and not all(a[k])]}


def compare_table(c: dict, candidate: str, against: str) -> str:
    lines = [f"{c['runs']} runs judged by both.", "", "| profile | runs meeting every target | checks met |",
             "| --- | ---: | ---: |"]
    for name, side in ((candidate, c["candidate"]), (against, c["against"])):
        lines.append(f"| {name} | {side['runs_met']} | {side['checks_met']} of {side['checks']} |")
    for what, says in (("gained", "passes and the other fails"), ("lost", "fails and the other passes")):
        lines += ["", f"Runs the candidate {says}: {len(c[what])}" + (":" if c[what] else "."), ""]
        lines += [f"- {' '.join(k)}" for k in c[what]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation judge", description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="the candidate profile (a name or a .json path)")
    ap.add_argument("runs", type=Path, nargs="+", help="run folders (each holding h200_run/ or the units)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=1, help="reports run at once (processes; default 1)")
    ap.add_argument("--against", type=Path, help="a summary.json to compare with (e.g. reports/validation/summary.json)")
    args = ap.parse_args(argv)
    from granisim.config.hardware import get_profile

    try:
        get_profile(args.profile)
    except ValueError as err:
        raise ValueError(f"profile {args.profile!r}: {one_line(err, None)}") from None
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give 1 or more")
    against = None
    if args.against is not None:
        try:
            against = json.loads(args.against.read_text())["records"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{args.against}: not a validation summary.json ({one_line(err)})") \
                from None
    jobs = []
    for run in args.runs:
        if not run.is_dir():
            raise ValueError(f"{run}: no such run folder")
        pairs = policy_models(run)
        if not pairs:
            raise ValueError(f"{run}: no validation units (validation_*.json) in it")
        for policy, model in pairs:
            out = args.out / run.name / f"{policy}-{model}"
            if not (out / "h200.json").exists():
                jobs.append((str(units_folder(run)), policy, model, str(out), args.profile))
    print(f"{len(jobs)} reports to write ({args.jobs} at a time)", flush=True)
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        for job, why in zip(jobs, (pool.map if pool else map)(_report, jobs)):
            print(f"{job[3]}: " + (f"skipped: {why}" if why else "done"), flush=True)
    reports = sorted(args.out.glob("*/*/h200.json"))
    if not reports:
        raise ValueError(f"{args.out}: no report could be written")
    recs = report_records(reports)
    (args.out / "summary.json").write_text(summary_json(recs))
    table = tables(recs)
    (args.out / "summary.md").write_text(table)
    print(table.strip().splitlines()[-1])
    if against is not None:
        c = compare(recs, against)
        text = compare_table(c, args.profile, str(args.against))
        (args.out / "compare.json").write_text(json.dumps(c, indent=1) + "\n")
        (args.out / "compare.md").write_text(text)
        print(text, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
