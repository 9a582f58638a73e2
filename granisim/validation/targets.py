"""The issue's validation targets for two runs of one device call, as a markdown table.

    granisim validation targets D1 D2 [--root reports/validation/runs]
    granisim validation targets D1 D2 E1 --profile-check shipped

Reads ROOT/runA/h200.json and ROOT/runB/h200.json (`granisim validation report`, each made with
`--check-profile` pointing at the other run's fit) and prints, per target, the errors for multi-agent /
control / Azure: each run held out (engine coefficients fitted on the other two workloads), and each
run judged by the other run's fit. Misses are bold. With ``--profile-check SUB`` it prints instead each run
judged by the profile its ROOT/runX/SUB/h200.json checked (e.g. the shipped profile, on runs it was not fitted on).
"""
from __future__ import annotations

import json
from pathlib import Path


from granisim.validation.gpu_runs import VALIDATION
from granisim.validation.validate import TARGETS
from granisim.config.files import OneLineParser, one_line, unreadable

WORKLOADS = tuple(VALIDATION)[:3]  # the first three validation workloads (the runs these tables cover);
# the full set, every policy and model: `granisim validation summary`
LABELS = {"step_median": "per-step median", "throughput_rps": "throughput", "tpot_p50_s": "TPOT p50",
          "tpot_p99_s": "TPOT p99", "ttft_p99_s": "TTFT p99"}  # table order


def errors(report: dict, variant: str, metric: str) -> list[float]:
    """Absolute errors in % per workload."""
    out = []
    for w in (w for w in WORKLOADS if w in report["workloads"]):  # a run may predate some workloads
        v = report["workloads"][w][variant]
        if v is None:  # no fit held this workload out (the run's only fitted one)
            continue
        e = v["step_errors"]["total"]["median"] if metric == "step_median" else v["end_to_end"][metric]["error"]
        out.append(abs(e) * 100)
    return out


def target_table(headers: list[str], cols: list[tuple[dict, str]]) -> str:
    """One row per target, one column per (report, variant): the workloads' errors, misses bold."""
    lines = ["| target | " + " | ".join(headers) + " |", "|---" * (len(cols) + 1) + "|"]
    for metric, label in LABELS.items():
        bound = TARGETS[metric] * 100
        cells = [" / ".join(f"**{x:.1f}**" if x > bound else f"{x:.1f}" for x in errors(rep, v, metric)) + "%"
                 for rep, v in cols]
        lines.append(f"| {label} <= {bound:g}% | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _report(path: Path, variants: tuple[str, ...]) -> dict:
    """A `granisim validation report` output with every figure the tables read (a ValueError naming the file
    where it is missing, not JSON, or lacks one)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: {unreadable(err, 'no such file')}") from None
    try:
        rep = json.loads(text)
        if not rep["workloads"]:
            raise ValueError("no workloads")
        for v in variants:
            for metric in LABELS:
                errors(rep, v, metric)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not a `granisim validation report` output with {' and '.join(variants)} "
                         f"figures ({one_line(err)})") from None
    return rep


def table(root: Path, a: str, b: str) -> str:
    reps = {r: _report(root / f"run{r}" / "h200.json", ("engine_calibrated_held_out", "check_profile"))
            for r in (a, b)}
    headers = [f"run {a} held out", f"run {b} held out", f"run {a}, fit on run {b}", f"run {b}, fit on run {a}"]
    return target_table(headers, [(reps[a], "engine_calibrated_held_out"), (reps[b], "engine_calibrated_held_out"),
                                  (reps[a], "check_profile"), (reps[b], "check_profile")])


def profile_check_table(root: Path, runs: list[str], sub: str, label: str | None = None) -> str:
    """Each run judged by the profile its ROOT/runX/SUB/h200.json checked; columns 'run X, LABEL' (default: the
    checked profile's name)."""
    reps = [_report(root / f"run{r}" / sub / "h200.json", ("check_profile",)) for r in runs]
    label = label or Path(next(iter(reps[0]["workloads"].values()))["check_profile"]["profile"]).stem
    return target_table([f"run {r}, {label}" for r in runs], [(rep, "check_profile") for rep in reps])


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation targets", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="two runs of one device call (with --profile-check: any runs)")
    ap.add_argument("--root", type=Path, default=Path("reports/validation/runs"))
    ap.add_argument("--profile-check", metavar="SUB", help="judge each run by the profile ROOT/runX/SUB/h200.json checked")
    args = ap.parse_args(argv)
    if args.profile_check:
        print(profile_check_table(args.root, args.runs, args.profile_check))
    elif len(args.runs) != 2:
        ap.error(f"runs: value {' '.join(args.runs)!r}: give two runs of one device call (or --profile-check SUB)")
    else:
        print(table(args.root, *args.runs))


if __name__ == "__main__":
    main()
