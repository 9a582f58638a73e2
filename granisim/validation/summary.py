"""Machine-readable validation summary: one record per workload x policy x model x machine x metric.

    granisim validation summary RAW --out reports/validation/summary.json
    granisim validation summary --reports REPORT/h200.json ... --out reports/validation/summary.json


Reads every ``validation_<unit>.json`` under RAW (as ``granisim validation gpu-run validate`` writes
them; the machine is the unit's folder under RAW, less a trailing ``h200_run``, e.g. ``runD1``) and
writes, per metric, ``measured``, ``predicted``, ``error`` (|predicted - measured| / measured) and,
for the metrics with a target, ``target`` and ``met``. Metrics: ``step_median`` (the median per-step
error on the same plan; no single measured/predicted value), the end-to-end metrics
(throughput, TTFT/TPOT p50/p99) and, where the run has them, the latency percentiles
``{ttft,tpot,e2e}_p{50,90,99}`` (:func:`granisim.validation.validate.percentile_errors`).
``mape`` holds, per policy, model and metric, the mean error over workloads and machines (held-out
workloads included, and flagged in their records), ``mape_by_workload`` the same per workload (over machines). With ``--reports`` the records come instead from
``granisim validation report --check-profile PROFILE`` outputs: the predictions of PROFILE as it stands (re-priced
and re-simulated on a CPU), so a run measured under one profile is judged by another (variant
``profile:NAME``). No GPU needed.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from granisim.validation.gpu_runs import HELD_OUT, VALIDATION, split_unit, unit_name
from granisim.validation.validate import TARGETS
from granisim.config.files import OneLineParser, one_line

RUN_LEAF = "h200_run"


def _run_parts(folder: Path) -> list[str]:
    """A run folder's path parts, less a trailing ``h200_run``."""
    parts = list(folder.parts)
    return parts[:-1] if parts and parts[-1] == RUN_LEAF else parts


def _machine(raw: Path, js: Path) -> str:
    return "/".join(_run_parts(js.parent.relative_to(raw))) or raw.resolve().name


def _unit(js: Path) -> tuple[str, str, str, str] | None:
    """(workload, policy, model, variant) from the file name (an older run's bare workload name: granikv on
    llama-3.1-8b); the variant is what the name carries after them (e.g. gc, noidle; empty for none)."""
    stem = js.stem[len("validation_"):]
    parsed = split_unit(stem)
    if parsed is None:
        return None
    w, pol, model = parsed
    full = unit_name(w, pol, model)
    rest = stem[len(full):] if stem.startswith(full) else stem[len(w):]
    return w, pol, model, rest.lstrip("_")


def _machine_of_dir(run_dir: str) -> str:
    parts = _run_parts(Path(run_dir))
    return parts[-1] if parts else run_dir


def _unit_records(base: dict, step_errors: dict, e2e: dict, percentiles: dict) -> list[dict]:
    out = [_record(base, "step_median", None, None, step_errors["total"].get("median"))]
    out += [_record(base, k, e["measured"], e["predicted"], e["error"]) for k, e in e2e.items()]
    out += [_record(base, k, e["measured"], e["predicted"], e["error"]) for k, e in percentiles.items()]
    return out


def report_records(paths: list[Path]) -> list[dict]:
    """Records of the ``check_profile`` variant of `granisim validation report` outputs (h200.json files)."""
    out = []
    for path in paths:
        try:
            rep = json.loads(Path(path).read_text())
            run_dir = rep["run"]["dir"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
            _fail(f"{path}: not a validation report with a run folder ({one_line(err)})")
        for name, w in rep.get("workloads", {}).items():
            chk, unit = w.get("check_profile"), split_unit(name)
            if chk is None or unit is None:
                continue
            wl, pol, model = unit
            base = {"workload": wl, "policy": pol, "model": model, "machine": _machine_of_dir(run_dir),
                    "variant": f"profile:{Path(chk['profile']).stem}", "held_out": wl in HELD_OUT,
                    "idle": w.get("idle"), "date": rep["run"].get("date"),
                    **({"host_probe_us": w["host_probe"]["us_per_plan"]} if w.get("host_probe") else {})}
            try:
                out += _unit_records(base, chk["step_errors"], chk["end_to_end"], chk.get("percentile_errors", {}))
            except (KeyError, TypeError, AttributeError) as err:
                _fail(f"{path}: workloads.{name}.check_profile: no step_errors and end_to_end figures "
                      f"({one_line(err)})")
    return out


def _record(base: dict, metric: str, measured, predicted, error) -> dict:
    for what, v in (("measured", measured), ("predicted", predicted), ("error", error)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):  # the caller names the file
            raise TypeError(f"{metric} {what} = {v!r}: not a number")
    target = TARGETS.get(metric)
    ok = error is not None and not (isinstance(error, float) and math.isnan(error))
    return {**base, "metric": metric, "measured": measured, "predicted": predicted, "error": error,
            "target": target, "met": (error <= target) if target is not None and ok else None}


def signed_error(r: dict) -> float | None:
    """(predicted - measured) / measured of a record; None where a side is missing or measured is 0."""
    if not r.get("measured") or r.get("predicted") is None:
        return None
    return r["predicted"] / r["measured"] - 1.0


def error_text(r: dict) -> str | None:
    """A table cell: the per-step median's |error|, or an end-to-end figure's signed error; None where it has none."""
    if r["metric"] == "step_median":
        return None if r["error"] is None else f"{r['error']:.1%}"
    v = signed_error(r)
    return None if v is None else f"{v:+.1%}"


def records(raw: Path) -> list[dict]:
    out = []
    for js in sorted(raw.rglob("validation_*.json")):
        try:
            rep = json.loads(js.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            _fail(f"{js}: not a readable validation JSON ({one_line(err)})")
        unit = _unit(js)
        if unit is None or not isinstance(rep, dict) or "end_to_end" not in rep:
            continue
        w, pol, model, variant = unit
        base = {"workload": w, "policy": pol, "model": model, "machine": _machine(raw, js), "variant": variant,
                "held_out": w in HELD_OUT, "idle": rep.get("idle"), "date": rep.get("date")}
        try:
            out += _unit_records(base, rep["step_errors"], rep["end_to_end"], rep.get("percentile_errors", {}))
        except (KeyError, TypeError, AttributeError) as err:
            _fail(f"{js}: not a validation report with step_errors and end_to_end figures "
                  f"({one_line(err)})")
    return out


def mape(recs: list[dict], by: tuple[str, ...] = ("policy", "model", "variant", "metric")) -> list[dict]:
    """Mean error per group of the fields ``by`` (default: per policy, model, variant and metric, over workloads
    and machines; with ``workload`` in ``by`` per workload, over machines: BLIS's convention)."""
    groups: dict[tuple, list[float]] = {}
    for r in recs:
        if r["error"] is not None and not math.isnan(r["error"]):
            groups.setdefault(tuple(r[k] for k in by), []).append(r["error"])
    return [{**dict(zip(by, key)), "n": len(e), "mape": sum(e) / len(e)} for key, e in sorted(groups.items())]


BY_WORKLOAD = ("workload", "policy", "model", "variant", "metric")


TABLE_METRICS = ("step_median", "throughput_rps", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s")


def run_checks(recs: list[dict]) -> dict[tuple, list[bool]]:
    """(machine, model, workload, policy) -> the met flags of its target checks (pure)."""
    out: dict[tuple, list[bool]] = {}
    for r in recs:
        if r.get("target") is not None and r.get("met") is not None:
            out.setdefault((r["machine"], r["model"], r["workload"], r["policy"]), []).append(bool(r["met"]))
    return out


def glance_table(recs: list[dict]) -> str:
    """Markdown: per model and workload, per policy, how many of its runs (one a machine folder) meet every
    target, of those judged ("2 / 3"; '-': none ran it) (pure)."""
    cells: dict[tuple, list[int]] = {}
    for (_, model, workload, policy), met in run_checks(recs).items():
        c = cells.setdefault((model, workload, policy), [0, 0])
        c[0] += all(met)
        c[1] += 1
    policies = [p for p in ("granikv", "token", "paged16") if any(k[2] == p for k in cells)]
    policies += sorted({k[2] for k in cells} - set(policies))
    order = {w: i for i, w in enumerate(VALIDATION)}
    lines = ["| model | workload | " + " | ".join(policies) + " |", "| --- | --- | " + " | ".join(["---:"] * len(policies)) + " |"]
    for model, workload in sorted({k[:2] for k in cells}, key=lambda k: (k[0], order.get(k[1], 99), k[1])):
        row = [f"{cells[(model, workload, p)][0]} / {cells[(model, workload, p)][1]}" if (model, workload, p) in cells
               else "-" for p in policies]
        lines.append(f"| {model} | {workload}{' (held out)' if workload in HELD_OUT else ''} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def signed_table(recs: list[dict]) -> str:
    """Markdown: one row per machine, model, workload and policy; signed errors ((predicted - measured) /
    measured; the per-step median is of |error|), target misses in bold; then the counts met (pure)."""
    rows: dict[tuple, dict] = {}
    for r in recs:
        if r["metric"] in TABLE_METRICS:
            key = (r["machine"], r["model"], r["policy"], r["workload"], r["held_out"])
            rows.setdefault(key, {})[r["metric"]] = r
    order = {w: i for i, w in enumerate(VALIDATION)}
    lines = ["| machine | model | workload | policy | per-step median | throughput | TPOT p50 | TPOT p99 | TTFT p50 | "
             "TTFT p99 |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    units_met = checks = checks_met = 0
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2], order.get(k[3], 99), k[3])):
        machine, model, policy, workload, held = key
        cells, ok = [], True
        for m in TABLE_METRICS:
            r = rows[key].get(m)
            text = None if r is None or r["error"] is None else error_text(r)
            if text is None:
                cells.append("-")
                continue
            if r["met"] is not None:
                checks += 1
                checks_met += r["met"]
                ok &= r["met"]
                text = text if r["met"] else f"**{text}**"
            cells.append(text)
        units_met += ok
        lines.append(f"| {machine} | {model} | {workload}{' (held out)' if held else ''} | {policy} | "
                     + " | ".join(cells) + " |")
    lines.append(f"\n{units_met} of {len(rows)} workload-policy-model runs meet every target; {checks_met} of {checks} "
                 "target checks are met.")
    return "\n".join(lines) + "\n"


def tables(recs: list[dict]) -> str:
    """summary.md: the runs meeting every target per workload, policy and model, then every run's errors."""
    return ("Runs that meet every target, of the runs of each workload, policy and model:\n\n" + glance_table(recs)
            + "\n" + signed_table(recs))


def _fail(msg: str):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)



def records_json(records: list[dict], **fields) -> str:
    """``{**fields, "records": records}`` as JSON text with a record a line: the file stays readable and
    diffable at a fraction of an indented file's size."""
    compact = (",", ":")
    head = json.dumps(fields, separators=compact)[:-1]
    rows = ",\n".join(json.dumps(r, separators=compact) for r in records)
    return f'{head}{"," if fields else ""}"records":[\n{rows}\n]}}\n'


def summary_json(recs: list[dict]) -> str:
    """The validation summary file: the records with the targets and their mean errors, overall and per workload."""
    return records_json(recs, targets=TARGETS, mape=mape(recs), mape_by_workload=mape(recs, BY_WORKLOAD))


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path, nargs="?", help="folder of validation runs (searched recursively)")
    ap.add_argument("--reports", type=Path, nargs="+", metavar="H200_JSON",
                    help="instead: `granisim validation report --check-profile` outputs (their check_profile variant)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--table", type=Path, help="also write the signed errors as a markdown table here")
    args = ap.parse_args(argv)
    if (args.raw is None) == (args.reports is None):
        _fail("give either a folder of validation runs or --reports, not both or neither")
    if args.reports:
        recs = report_records(args.reports)
        if not recs:
            _fail(f"{args.reports[0]}: no workload with a check_profile variant in these reports")
    else:
        if not args.raw.is_dir():
            _fail(f"{args.raw}: no such folder")
        recs = records(args.raw)
        if not recs:
            _fail(f"{args.raw}: no validation_*.json with end-to-end results under it")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(summary_json(recs))
    if args.table:
        args.table.write_text(tables(recs))
    units = {(r["workload"], r["policy"], r["model"], r["machine"], r["variant"]) for r in recs}
    print(f"{args.out}: {len(recs)} records, {len(units)} runs of a workload")


if __name__ == "__main__":
    main()
