"""The shared re-read coefficient each decode batch size implies, from the baselines' validation units.

    python reports/validation/shared_reread/by_batch.py RAW/validation/run{G1,H1,R1,S1,T1,U1} \
        --out reports/validation/shared_reread/by_batch.json

Every decode step of the token and paged16 units over shared prefixes (multi_agent_16k, multi_turn_150/500, both
models) is re-priced with ``attn.decode.shared_reread`` at 0.6 (shipped) and 1.0. A step's decode-attention price
is linear in the coefficient (each re-reader of a group's prefix pays it per token), so per batch bin the value
that makes the summed price equal the summed measured time is 0.6 + (measured - price@0.6) / slope. By the same
line, per unit and per value in VALUES: decode attention and the decode step, priced / measured (the figures
`granisim validation step-parts --set attn.decode.shared_reread=V` gives for class "decode"), their median and
range over the units. Prints both tables and writes JSON; nothing here needs a GPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from granisim.config.hardware import get_profile, with_values
from granisim.config.models import get_model
from granisim.validation.clock_term import run_units
from granisim.validation.validate import reprice

KEY, SHIPPED = "attn.decode.shared_reread", 0.6
WORKLOADS = ("multi_agent_16k", "multi_turn_150", "multi_turn_500")
BINS = (0, 4, 8, 16, 32, 64, 128, 512)
VALUES = (0.6, 0.7, 0.8)


def decode_rows(runs: list[Path]) -> pd.DataFrame:
    base = get_profile("h200-engine")
    if base[KEY] != SHIPPED:
        raise SystemExit(f"error: h200-engine's {KEY} is {base[KEY]}, this report assumes {SHIPPED}")
    one = with_values(base, {KEY: 1.0}, where="by_batch.py")
    out = []
    for run in runs:
        for unit, steps, plans, model in run_units(run):
            name = unit.split("/", 1)[1]
            if not any(name.startswith(f"{w}_{p}_") for w in WORKLOADS for p in ("token", "paged16")):
                continue
            m = get_model(model)
            a, b = reprice(steps, plans, base, m), reprice(steps, plans, one, m)
            dec = ~a.prefill.astype(bool)
            out.append(pd.DataFrame({"unit": unit, "model": model, "batch": a.batch[dec],
                                     "measured": a.measured_attn_decode[dec],
                                     "at_shipped": a.predicted_attn_decode[dec], "at_one": b.predicted_attn_decode[dec],
                                     "step_measured": a.measured_s[dec], "step_at_shipped": a.predicted_s[dec]}))
    if not out:
        raise SystemExit(f"error: no token or paged16 units of {', '.join(WORKLOADS)} under the runs given")
    return pd.concat(out, ignore_index=True)


def implied(df: pd.DataFrame) -> list[dict]:
    rows = []
    for (model, b), g in df.groupby([df.model, pd.cut(df.batch, BINS)], observed=True):
        slope = (g.at_one - g.at_shipped).sum() / (1.0 - SHIPPED)
        rows.append({"model": model, "batch": f"{b.left + 1}-{b.right}", "steps": int(len(g)),
                     "units": int(g.unit.nunique()), "measured_s": float(g.measured.sum()),
                     "priced_over_measured": float(g.at_shipped.sum() / g.measured.sum()),
                     "implied": float(SHIPPED + (g.measured.sum() - g.at_shipped.sum()) / slope) if slope > 0
                     else float("nan")})
    return rows


def by_value(df: pd.DataFrame) -> list[dict]:
    """Per value: decode attention and decode step priced / measured, median and range over the units."""
    rows = []
    for v in VALUES:
        extra = (df.at_one - df.at_shipped) * (v - SHIPPED) / (1.0 - SHIPPED)  # the price is linear in the value
        g = df.assign(attn=df.at_shipped + extra, step=df.step_at_shipped + extra).groupby("unit")[
            ["attn", "measured", "step", "step_measured"]].sum()
        attn, step = g.attn / g.measured, g.step / g.step_measured
        rows.append({"value": v, "units": int(len(g)), "attn_decode": _spread(attn), "decode_step": _spread(step)})
    return rows


def _spread(x: pd.Series) -> dict:
    return {"median": float(x.median()), "min": float(x.min()), "max": float(x.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    df = decode_rows(args.runs)
    values = by_value(df)
    print("| coefficient | units | decode attention, median (range) | decode step, median (range) |")
    print("| ---: | ---: | --- | --- |")
    for r in values:
        a, t = r["attn_decode"], r["decode_step"]
        print(f"| {r['value']:g} | {r['units']} | {a['median']:.3f} ({a['min']:.3f}-{a['max']:.3f}) | "
              f"{t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f}) |")
    print()
    rows = implied(df)
    print("| model | decode batch | steps | units | measured s | priced / measured at 0.6 | implied coefficient |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['steps']} | {r['units']} | {r['measured_s']:.2f} | "
              f"{r['priced_over_measured']:.3f} | {r['implied']:.2f} |")
    doc = {"runs": [str(r) for r in args.runs], "coefficient": KEY, "by_value": values, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
