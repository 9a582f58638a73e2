"""The paper's setting measured on the real engine against the simulator's prediction of the same scenarios.

    granisim validation paper-setting UNITS [--profile h200-engine] [--sensitivity 0.98 1.02] [--out JSON] [--table MD]

UNITS holds the ``paper_lp<L>_<policy>_rep<r>.json`` of ``granisim validation gpu-run paper`` (200 Poisson requests
above granikv's capacity, 4 roles, ShareGPT-like outputs: ``gpu_runs.PAPER``). Each (L_p, policy) is simulated once
with the cost model on ``--profile`` (the scenario is deterministic) and set against the mean of its repetitions;
the table gives the measured mean with the repetitions' spread, the prediction, the signed error
(predicted - measured) / measured, and the granikv / baseline throughput ratio measured (per repetition) and
predicted. ``--sensitivity F ...`` simulates each scenario again with every step's time scaled by each F
(``hardware.step_time_scale``, as ``granisim run --sensitivity``): how far a few percent of step-time error moves
each metric. Where the units' step frames
(``paper_*_steps.parquet``) lie beside them, a second table sets the median step time of each step class (decode
only; prefill by new tokens) against the simulator's, run without fast-forward so that it also logs every step.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from granisim.config.files import OneLineParser

METRICS = ("throughput_rps", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s")


def load_units(folder: Path) -> list[dict]:
    """The units' JSON; ValueError naming the file for one that is not a paper-setting unit."""
    units = []
    for f in sorted(folder.glob("paper_lp*_rep*.json")):
        try:
            u = json.loads(f.read_text())
            missing = [k for k in ("lp", "policy", "rep", *METRICS) if k not in u]
        except (OSError, ValueError) as err:
            raise ValueError(f"{f}: not readable JSON ({err})") from None
        if missing:
            raise ValueError(f"{f}: field {missing[0]} missing (not a gpu-run paper unit)")
        units.append(u)
    if not units:
        raise ValueError(f"{folder}: no paper_lp*_rep*.json (granisim validation gpu-run paper --out {folder})")
    return units


STEP_EDGES = (2048, 4096, 8192)  # prefill classes: new tokens up to each edge, then beyond the last


def step_class(prefill_tokens) -> list[str]:
    """Each step's class: "decode" (no prefill tokens), "prefill <= E" or "prefill > last edge" (pure)."""
    out = []
    for t in prefill_tokens:
        edge = next((e for e in STEP_EDGES if t <= e), None)
        out.append("decode" if t == 0 else f"prefill <= {edge}" if edge else f"prefill > {STEP_EDGES[-1]}")
    return out


def step_medians(frames) -> dict[str, tuple[int, float]]:
    """class -> (steps per frame, median duration in seconds) over step frames with ``prefill_tokens`` and
    ``duration_s`` (pure)."""
    import pandas as pd

    df = pd.concat(frames, ignore_index=True)
    df = df.assign(cls=step_class(df.prefill_tokens))
    return {c: (round(len(g) / len(frames)), float(g.duration_s.median())) for c, g in df.groupby("cls")}


def predict(keys, profile: str, factor: float = 1.0, steps: bool = False) -> dict[tuple[int, str], dict]:
    """(L_p, policy) -> the simulated summary of that paper-setting scenario on ``profile``, every step's time
    times ``factor`` (``hardware.step_time_scale``); with ``steps``, its step frame instead, simulated without
    fast-forward so that every step is logged, as the engine runs them."""
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate
    from granisim.validation.gpu_runs import paper_scenario

    changes = {**({"hardware.step_time_scale": factor} if factor != 1.0 else {}),
               **({"scheduler.fast_forward": False} if steps else {})}
    out = {}
    for lp, pol in keys:
        sc = paper_scenario(pol, lp, profile)
        res = simulate(prepare(sc.with_changes(**changes) if changes else sc), progress=False)
        frame = res.steps.frame()
        out[(lp, pol)] = frame if steps else summarize(requests_frame(res.records), frame, res.end_s)
    return out


def rows(units: list[dict], predicted: dict[tuple[int, str], dict]) -> list[dict]:
    """One row per (L_p, policy): measured mean / min / max over repetitions, predicted, signed error (pure)."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for u in units:
        groups.setdefault((u["lp"], u["policy"]), []).append(u)
    out = []
    for key in sorted(groups, key=lambda k: (-k[0], k[1])):
        reps = groups[key]
        row = {"lp": key[0], "policy": key[1], "reps": len(reps)}
        for m in METRICS:
            vals = [r[m] for r in reps]
            mean, pred = statistics.fmean(vals), predicted[key][m]
            row[m] = {"measured": mean, "min": min(vals), "max": max(vals), "predicted": pred,
                      "error": (pred - mean) / mean}
        out.append(row)
    return out


def ratios(units: list[dict], predicted: dict[tuple[int, str], dict]) -> list[dict]:
    """granikv / baseline throughput: measured within each repetition (both policies of one repetition) and
    predicted, per L_p and baseline (pure)."""
    by = {(u["lp"], u["policy"], u["rep"]): u["throughput_rps"] for u in units}
    out = []
    for lp in sorted({u["lp"] for u in units}, reverse=True):
        for base in sorted({u["policy"] for u in units if u["lp"] == lp and u["policy"] != "granikv"}):
            reps = sorted(r for (l, p, r) in by if l == lp and p == base and (lp, "granikv", r) in by)
            if not reps or (lp, "granikv") not in predicted:
                continue
            meas = [by[(lp, "granikv", r)] / by[(lp, base, r)] for r in reps]
            pred = predicted[(lp, "granikv")]["throughput_rps"] / predicted[(lp, base)]["throughput_rps"]
            out.append({"lp": lp, "baseline": base, "measured": meas, "predicted": pred})
    return out


def sensitivity(base: dict[tuple[int, str], dict], scaled: dict[float, dict[tuple[int, str], dict]]) -> list[dict]:
    """Per (L_p, policy) and factor: each metric's change against the unscaled prediction (pure)."""
    return [{"lp": key[0], "policy": key[1], "factor": f,
             **{m: (pred[key][m] - base[key][m]) / base[key][m] for m in METRICS}}
            for key in sorted(base, key=lambda k: (-k[0], k[1])) for f, pred in sorted(scaled.items())]


def format_table(table: list[dict], ratio: list[dict], profile: str, sens: list[dict] = ()) -> str:
    def cell(d: dict, m: str) -> str:
        scale, fmt, unit = {"throughput_rps": (1.0, ".2f", ""), "tpot_p50_s": (1e3, ".1f", " ms"),
                            "tpot_p99_s": (1e3, ".0f", " ms")}.get(m, (1.0, ".2f", " s"))
        spread = f" ({d['min'] * scale:{fmt}}-{d['max'] * scale:{fmt}})" if d["min"] != d["max"] else ""
        return f"{d['measured'] * scale:{fmt}}{spread} / {d['predicted'] * scale:{fmt}}{unit} ({d['error']:+.1%})"

    head = ["L_p", "policy", "reps", "req/s", "TPOT p50", "TPOT p99", "TTFT p50", "TTFT p99"]
    lines = [f"measured mean (min-max over repetitions) / predicted on {profile} (signed error):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        lines.append(f"| {r['lp']} | {r['policy']} | {r['reps']} | " + " | ".join(cell(r[m], m) for m in METRICS) + " |")
    lines += ["", "| L_p | granikv / | measured, each repetition | predicted |", "|---|---|---|---|"]
    for q in ratio:
        lines.append(f"| {q['lp']} | {q['baseline']} | {', '.join(f'{x:.3f}' for x in q['measured'])} | "
                     f"{q['predicted']:.3f} |")
    if sens:
        lines += ["", "predicted metrics with every step's time scaled by F, change against F = 1:", "",
                  "| L_p | policy | F | " + " | ".join(METRICS) + " |", "|" + "---|" * (3 + len(METRICS))]
        lines += [f"| {r['lp']} | {r['policy']} | {r['factor']:g} | " + " | ".join(f"{r[m]:+.1%}" for m in METRICS)
                  + " |" for r in sens]
    return "\n".join(lines) + "\n"


def format_steps(measured: dict, predicted: dict) -> str:
    """Markdown: per (L_p, policy) and step class, steps a run and median step time, measured / simulated."""
    lines = ["median step time by class, measured (steps a repetition) / simulated without fast-forward:", "",
             "| L_p | policy | class | measured | simulated |", "|---|---|---|---|---|"]
    for key in sorted(measured, key=lambda k: (-k[0], k[1])):
        m, p = step_medians(measured[key]), step_medians([predicted[key]])
        for c in sorted(set(m) | set(p), key=lambda c: (c != "decode", len(c), c)):
            cell = [f"{d[c][1] * 1e3:.1f} ms ({d[c][0]})" if c in d else "-" for d in (m, p)]
            lines.append(f"| {key[0]} | {key[1]} | {c} | {cell[0]} | {cell[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation paper-setting", description=__doc__.split("\n\n")[0])
    ap.add_argument("units", type=Path, help="folder of gpu-run paper's paper_*.json")
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--sensitivity", type=float, nargs="+", default=[], metavar="F",
                    help="also simulate with every step's time scaled by each F (e.g. 0.98 1.02)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    ap.add_argument("--table", type=Path, help="write the markdown table here (it is printed either way)")
    args = ap.parse_args(argv)
    bad = [f for f in args.sensitivity if not 0 < f < 10]
    if bad:
        ap.error(f"--sensitivity {bad[0]}: give factors between 0 and 10 (e.g. 0.98 1.02)")
    try:
        units = load_units(args.units)
        keys = sorted({(u["lp"], u["policy"]) for u in units})
        pred = predict(keys, args.profile)
        sens = sensitivity(pred, {f: predict(keys, args.profile, f) for f in args.sensitivity})
    except ValueError as err:
        ap.error(str(err))
    table, ratio = rows(units, pred), ratios(units, pred)
    text = format_table(table, ratio, args.profile, sens)
    measured = _step_frames(args.units, units)
    if measured:
        text += "\n" + format_steps(measured, predict(sorted(measured), args.profile, steps=True))
    print(text, end="")
    if args.table:
        args.table.write_text(text)
    if args.out:
        args.out.write_text(json.dumps({"profile": args.profile, "rows": table, "ratios": ratio, "sensitivity": sens},
                                       indent=1) + "\n")


def _step_frames(folder: Path, units: list[dict]) -> dict:
    """(L_p, policy) -> the step frames of its repetitions, where every unit of it has one beside its JSON."""
    import pandas as pd

    out: dict = {}
    for u in units:
        f = folder / f"paper_lp{u['lp']}_{u['policy']}_rep{u['rep']}_steps.parquet"
        out.setdefault((u["lp"], u["policy"]), []).append(pd.read_parquet(f) if f.exists() else None)
    return {k: v for k, v in out.items() if all(x is not None for x in v)}
