"""Which steps and which parts a profile misprices: predicted / measured time summed by step class.

    granisim validation step-parts RAW/validation/runJ1 [RUN ...] [--profile h200-engine] [--unit NAME ...]
        [--bins 512,2048] [--decode-bins 4,8,16,32,64] [--skew-bins 1.5,2,3] [--pool] [--set COEFFICIENT=VALUE ...]
        [--out step_parts.json]

Every unit of the runs (all policies and models found) is re-priced step by step with PROFILE; its steps
are classed as decode (no prefill work) or prefill by the step's new tokens (``--bins``; by default <= 512,
<= 2048, more: the engine runs steps over 2048 tokens eagerly) and by how many requests prefill in it (1, 2, 3, 4 or more:
the prefill attention launch spans them all); with ``--decode-bins``, decode steps also by their batch (requests
decoding), and with ``--skew-bins`` by their batch's skew (its longest context over the mean: a batch of one long
request among short ones splits its KV unevenly). ``--pool`` adds one table per model and policy over all the units' steps together (``--pool machine``:
per machine, model and policy). Per unit and class: the steps, the measured seconds, and
predicted / measured of the step and of each part summed over the class's steps (1.00: priced right on
the whole; below 1: the profile is optimistic), and the median over its steps of |predicted / measured - 1|
(``step_err_p50``); where the run recorded it, the median of the serving loop's own
host time before a step (``host_between_ms``: the same code on every machine, so the host's speed). Nothing here
needs a GPU. A missing folder or a run without units raises ValueError: one line and exit 2 from the CLI.
"""
from __future__ import annotations

import json
import math
from bisect import bisect_left
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.config.hardware import get_profile, with_values
from granisim.config.models import get_model
from granisim.costmodel.operators import BREAKDOWN_KEYS
from granisim.validation.clock_term import run_units
from granisim.validation.gpu_runs import split_unit
from granisim.validation.validate import reprice
from granisim.config.files import OneLineParser

HOST = "host_between_ms"  # median per step, where the run's steps carry host_between_s (not a ratio)
STEP_ERR = "step_err_p50"  # median over the class's steps of |predicted / measured - 1| (the report's per-step median)
EDGES = (512, 2048)  # the default token bins' upper edges: <= 512, <= 2048, > 2048 (the engine's eager limit)


def token_bins(edges=EDGES) -> tuple[tuple[float, str], ...]:
    """((upper edge, label), ...) for ascending ``edges``, the last bin open: (512, 2048) -> <= 512, <= 2048, > 2048."""
    return (*((e, f"<= {e}") for e in edges), (np.inf, f"> {edges[-1]}"))


TOKEN_BINS = token_bins()


def step_class(tokens: int, prefill_requests: int, bins=TOKEN_BINS, batch: int = 0,
               decode_edges: tuple[int, ...] = (), skew: float = 1.0,
               skew_edges: tuple[float, ...] = ()) -> tuple[tuple[int, ...], str]:
    """(sort key, label): 'decode' (with ``decode_edges``: 'decode, <lo>-<hi> req' by the step's ``batch``, the
    last bin open; with ``skew_edges``, then ', skew <= <e>' by the batch's ``skew``, its longest context over
    the mean, the last bin open), or 'prefill <bin> tokens, <n> req' (n capped at '4+') (pure)."""
    if prefill_requests == 0:
        key, label = (0, 0), "decode"
        if decode_edges:
            i = bisect_left(decode_edges, batch)  # the first upper edge >= batch; past the last: the open bin
            lo = decode_edges[i - 1] + 1 if i else 1
            key = (0, i)
            label += f", {lo}-{decode_edges[i]} req" if i < len(decode_edges) else f", > {decode_edges[-1]} req"
        if skew_edges:
            j = bisect_left(skew_edges, skew)
            key = (*key, j)
            label += f", skew <= {skew_edges[j]:g}" if j < len(skew_edges) else f", skew > {skew_edges[-1]:g}"
        return key, label
    i, label = next((i, label) for i, (hi, label) in enumerate(bins) if tokens <= hi)
    n = min(prefill_requests, 4)
    return (i + 1, n), f"prefill {label} tokens, {n if n < 4 else '4+'} req"


def batch_skew(plan) -> float:
    """A decode step's longest context over its mean, in tokens each decoding request reads (1: all alike)."""
    lens = [r.context_len + 1 for r in plan.requests if not r.is_prefill]
    return max(lens) * len(lens) / sum(lens) if lens else 1.0


def class_table(steps: pd.DataFrame, plans: list, bins=TOKEN_BINS, decode_edges: tuple[int, ...] = (),
                skew_edges: tuple[float, ...] = ()) -> pd.DataFrame:
    """Per step class of re-priced ``steps`` (and their ``plans``): steps, measured seconds, and predicted /
    measured of the total and of each part (NaN where the class measured none of it)."""
    n_pf = [sum(1 for r in p.requests if r.is_prefill) for p in plans]
    batch = steps["batch"] if decode_edges else pd.Series(0, index=steps.index)
    skew = [batch_skew(p) if skew_edges and not n else 1.0 for p, n in zip(plans, n_pf)]
    cls = pd.Series([step_class(int(t), n, bins, int(b), decode_edges, k, skew_edges)
                     for t, n, b, k in zip(steps["tokens"], n_pf, batch, skew)], index=steps.index)
    parts = [k for k in BREAKDOWN_KEYS if f"measured_{k}" in steps and f"predicted_{k}" in steps]
    rows = []
    for (_, c), g in steps.groupby(cls, sort=True):
        r = {"class": c, "steps": int(len(g)), "measured_s": float(g["measured_s"].sum()),
             "total": float(g["predicted_s"].sum() / g["measured_s"].sum()),
             STEP_ERR: float((g["predicted_s"] / g["measured_s"] - 1.0).abs().median())}
        for k in parts:
            m = float(g[f"measured_{k}"].sum())
            r[k] = float(g[f"predicted_{k}"].sum() / m) if m > 0 else float("nan")
        if "host_between_s" in g:  # the serving loop's own host time before a step: the host's speed that minute
            r[HOST] = float(g["host_between_s"].median() * 1e3)
        rows.append(r)
    return pd.DataFrame(rows)


def format_table(unit: str, table: pd.DataFrame) -> str:
    parts = [c for c in table.columns if c not in ("class", "steps", "measured_s", "total", STEP_ERR, HOST)]
    host = HOST in table.columns
    head = f"| steps | n | measured s | total | {STEP_ERR} | " + " | ".join(parts) + " |" + (f" {HOST} |" if host else "")
    out = [f"{unit}", "", head,
           "|---|---:|---:|---:|---:|" + "---:|" * (len(parts) + host)]
    for r in table.to_dict(orient="records"):
        cells = " | ".join("-" if math.isnan(r[p]) else f"{r[p]:.3f}" for p in parts)
        more = f" {r[HOST]:.3f} |" if host else ""
        out.append(f"| {r['class']} | {r['steps']} | {r['measured_s']:.2f} | {r['total']:.3f} | {r[STEP_ERR]:.3f} | "
                   f"{cells} |{more}")
    return "\n".join(out)


def _edges(flag: str, text: str, what: str, kind=int) -> tuple:
    """Ascending finite numbers >= 1 of ``kind`` from 'a,b,c', or ValueError naming the flag and value."""
    try:
        edges = tuple(kind(x) for x in text.split(","))
    except ValueError:
        edges = ()
    if not edges or any(a >= b for a, b in zip(edges, edges[1:])) or not edges[0] >= 1 or not math.isfinite(edges[-1]):
        numbers = "whole numbers" if kind is int else "numbers"
        raise ValueError(f"{flag} {text!r}: give ascending {numbers} of {what}")
    return edges


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation step-parts", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run folders (each holding h200_run/ or the units)")
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--unit", nargs="+", help="only these units (e.g. arxiv_replay_500_granikv_qwen-2.5-14b)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                    help="price with these coefficients of the profile replaced (a what-if, e.g. "
                         "attn.decode.shared_reread=0.7)")
    ap.add_argument("--bins", default=",".join(map(str, EDGES)),
                    help="prefill steps' token bins, their upper edges ascending (default 512,2048)")
    ap.add_argument("--decode-bins", default="",
                    help="decode steps' batch bins, their upper edges ascending (e.g. 4,8,16,32,64; default: one class)")
    ap.add_argument("--skew-bins", default="",
                    help="decode steps also by their batch's skew, the longest context over the mean, the bins' upper "
                         "edges ascending (e.g. 1.5,2,3; default: not split)")
    ap.add_argument("--pool", nargs="?", const="policy", choices=("policy", "machine"),
                    help="also one table per model and policy (or per machine, model and policy: --pool machine), "
                         "the units' steps pooled")
    args = ap.parse_args(argv)
    edges = _edges("--bins", args.bins, "tokens, e.g. 512,2048")
    decode_edges = _edges("--decode-bins", args.decode_bins, "requests, e.g. 4,8,16,32,64") if args.decode_bins else ()
    skew_edges = _edges("--skew-bins", args.skew_bins, "1 or more (longest context over the mean), e.g. 1.5,2,3",
                        float) if args.skew_bins else ()
    values = {}
    for item in args.set:
        name, _, value = item.partition("=")
        try:
            values[name] = float(value)
        except ValueError:
            raise ValueError(f"--set {item!r}: give NAME=VALUE with a number, e.g. attn.decode.shared_reread=0.7") \
                from None
    for run in args.runs:
        if not run.is_dir():
            raise ValueError(f"{run}: no such run folder")
    prof = with_values(get_profile(args.profile), values) if values else get_profile(args.profile)
    doc = {"profile": args.profile, **({"set": values} if values else {}), "units": {}}
    pools: dict[str, list] = {}  # "model policy" -> [(re-priced steps, plans)] of its units
    for unit, steps, plans, model in (u for run in args.runs for u in run_units(run)):
        name = unit.split("/", 1)[1]
        if args.unit and name not in args.unit:
            continue
        priced = reprice(steps, plans, prof, get_model(model))
        table = class_table(priced, plans, token_bins(edges), decode_edges, skew_edges)
        doc["units"][unit] = table.to_dict(orient="records")
        print(format_table(unit, table) + "\n")
        if args.pool:
            policy = (split_unit(name) or (None, "?", None))[1]
            key = f"{model} {policy}" if args.pool == "policy" else f"{unit.split('/', 1)[0]} {model} {policy}"
            pools.setdefault(key, []).append((priced, plans))
    if not doc["units"]:
        raise ValueError(f"no validation units under {', '.join(map(str, args.runs))}"
                         + (f" named {', '.join(args.unit)}" if args.unit else ""))
    if args.pool:
        doc["pooled"] = {}
        for key, parts in sorted(pools.items()):
            table = class_table(pd.concat([s for s, _ in parts], ignore_index=True), [p for _, ps in parts for p in ps],
                                token_bins(edges), decode_edges, skew_edges)
            doc["pooled"][key] = {"units": len(parts), "classes": table.to_dict(orient="records")}
            print(format_table(f"pooled: {key} ({len(parts)} units)", table) + "\n")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1, separators=(",", ":"), allow_nan=True) + "\n")


if __name__ == "__main__":
    main()
