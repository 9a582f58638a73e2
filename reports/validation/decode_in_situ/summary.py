"""What the decode price misses: the kernel over shared prefixes alone, and the engine's launches alone.

    python reports/validation/decode_in_situ/summary.py \
        --shared calibration/raw/h200_more/shared_decode_pool6m calibration/raw/h200_more/shared_decode_pool22m \
        --in-situ RAW/engine/decode_in_situ --prefill RAW/engine/prefill_in_situ_all/pf \
        --out reports/validation/decode_in_situ/summary.json

1. ``--shared`` (``python -m calibration.measure --only shared_decode``): B requests over k roles' shared
   prefixes against the same launch over distinct contexts. Per batch, the re-read share it implies,
   ``f = (t_shared / t_distinct * B (L + s) - (k L + B s)) / ((B - k) L)`` (bytes streamed at the
   distinct launch's rate), median over storages, group sizes, prefix lengths and roles; and the ratio
   of the two pools' timings (a 22M-slot pool against a 6M-slot one: the page-table reach).
2. ``--in-situ`` (``python -m gpu_backend.bench.decode_in_situ``): sampled decode steps of the real engine,
   their ``attn_decode`` part against the same launches alone (in-step / alone), the launches over
   compacted slot ids against their own ids (compact / alone), and the price of the step's
   ``attn_decode`` (shipped h200-engine, re-priced from the stored plans) against the launches alone;
   medians per unit and batch bin.

3. ``--prefill`` (the same probe with ``--prefill-every``): sampled eager prefill steps, their ``attn_prefill``
   and ``linear`` parts against the same launches alone right after the step (hot) and, for the first few,
   after idling (cool), and the shipped price of each part against both; medians by the step's prefilling
   requests.

Prints the tables and writes JSON; nothing here needs a GPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from granisim.calibration.reread import KEY, reread_share
from granisim.config.hardware import get_profile
from granisim.config.models import get_model
from granisim.validation.gpu_runs import split_unit
from granisim.validation.plans import load_plans
from granisim.validation.validate import reprice

BATCH_BINS = (0, 16, 32, 64, 96, 128)


def shared_table(dirs: list[Path]) -> dict:
    frames = [reread_share(d) for d in dirs]
    first = frames[0]
    by_b = first.groupby("B").agg(f_median=("f", "median"), f_min=("f", "min"), f_max=("f", "max"),
                                  ratio_median=("ratio", "median"))
    out = {"points": int(len(first)), "by_batch": {int(b): {k: round(float(v), 3) for k, v in r.items()}
                                                   for b, r in by_b.iterrows()}}
    if len(frames) > 1:
        both = first.merge(frames[1], on=KEY, suffixes=("", "_big"))
        both["pool_ratio"] = both.shared_us_big / both.shared_us
        both["pool_ratio_distinct"] = both.distinct_us_big / both.distinct_us
        out["pool"] = {st: {"shared_median": round(float(g.pool_ratio.median()), 3),
                            "shared_max": round(float(g.pool_ratio.max()), 3),
                            "distinct_median": round(float(g.pool_ratio_distinct.median()), 3),
                            "distinct_max": round(float(g.pool_ratio_distinct.max()), 3)}
                       for st, g in both.groupby("storage")}
    return out


def priced_probes(run: Path, csv: str, profile: str, columns: list[str]) -> pd.DataFrame:
    """The probe's rows joined with the shipped price of each probed step (``columns`` of the re-priced log)."""
    probes = pd.read_csv(run / csv)
    prof = get_profile(profile)
    frames = []
    for unit, g in probes.groupby("unit"):
        _, _, model = split_unit(unit)
        steps = pd.read_parquet(run / unit / "steps.parquet")
        priced = reprice(steps, load_plans(run / unit / "plans.pkl"), prof, get_model(model))
        frames.append(g.merge(priced[["step", *columns]], on="step"))
    return pd.concat(frames, ignore_index=True)


def in_situ_table(run: Path, profile: str) -> pd.DataFrame:
    j = priced_probes(run, "in_situ.csv", profile, ["predicted_attn_decode"])
    return j.assign(in_step_vs_alone=j.in_step_s / j.alone_s, compact_vs_alone=j.dec_compact_s / j.dec_alone_s,
                    priced_vs_alone=j.predicted_attn_decode / j.alone_s,
                    batch_bin=pd.cut(j.batch, BATCH_BINS).astype(str))


PREFILL_PARTS = {"attn": "attn_prefill", "linear": "linear"}  # part name -> the probe's column stem
PREFILL_RATIOS = {"in_step_vs_hot": ("in_step_{}_s", "hot_{}_s"), "cool_vs_hot": ("cold_{}_s", "hot_{}_s"),
                  "priced_vs_hot": ("predicted_{}", "hot_{}_s"), "priced_vs_in_step": ("predicted_{}", "in_step_{}_s")}


def prefill_rows(run: Path, profile: str) -> list[dict]:
    """Median ratios per prefilling requests (4 and more together) and part."""
    j = priced_probes(run, "in_situ_prefill.csv", profile, ["predicted_attn_prefill", "predicted_linear"])
    rows = []
    for req, g in j.groupby(j.prefill_requests.clip(upper=4)):
        for part, col in PREFILL_PARTS.items():
            ratios = {k: (g[num.format(col)] / g[den.format(col)]).median() for k, (num, den) in PREFILL_RATIOS.items()}
            rows.append({"requests": int(req), "part": part, "steps": len(g), "tokens": int(g.tokens.median()),
                         **{k: None if pd.isna(v) else float(v) for k, v in ratios.items()}})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", type=Path, nargs="+", required=True, help="shared_decode runs (6M-slot pool first)")
    ap.add_argument("--in-situ", type=Path, required=True)
    ap.add_argument("--prefill", type=Path, help="a probe run with --prefill-every (its in_situ_prefill.csv)")
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    for d in args.shared:
        if not (d / "shared_decode.csv").is_file():
            ap.error(f"--shared: value {str(d)!r}: no shared_decode.csv (python -m calibration.measure --only "
                     f"shared_decode writes it)")
    if not (args.in_situ / "in_situ.csv").is_file():
        ap.error(f"--in-situ: value {str(args.in_situ)!r}: no in_situ.csv (python -m gpu_backend.bench.decode_in_situ "
                 f"writes it)")
    if args.prefill is not None and not (args.prefill / "in_situ_prefill.csv").is_file():
        ap.error(f"--prefill: value {str(args.prefill)!r}: no in_situ_prefill.csv (python -m "
                 f"gpu_backend.bench.decode_in_situ --prefill-every N writes it)")
    sh = shared_table(args.shared)
    print("| decode batch | re-read share f, median (range) | shared / distinct |\n|---:|---|---:|")
    for b, r in sh["by_batch"].items():
        print(f"| {b} | {r['f_median']:.2f} ({r['f_min']:.2f}-{r['f_max']:.2f}) | {r['ratio_median']:.2f} |")
    for st, r in sh.get("pool", {}).items():
        print(f"pool 22M / 6M slots, {st}: shared median {r['shared_median']:.3f} (max {r['shared_max']:.3f}), "
              f"distinct {r['distinct_median']:.3f} (max {r['distinct_max']:.3f})")
    j = in_situ_table(args.in_situ, args.profile)
    cols = ["in_step_vs_alone", "compact_vs_alone", "priced_vs_alone"]
    t = j.groupby(["unit", "batch_bin"], sort=True).agg(steps=("step", "size"), **{c: (c, "median") for c in cols})
    print("\n| unit | decode batch | steps probed | in-step / alone | compact ids / own ids | priced / alone |")
    print("|---|---|---:|---:|---:|---:|")
    rows = []
    for (unit, b), r in t.iterrows():
        print(f"| {unit} | {b} | {int(r.steps)} | {r.in_step_vs_alone:.3f} | {r.compact_vs_alone:.3f} | "
              f"{r.priced_vs_alone:.3f} |")
        rows.append({"unit": unit, "batch": b, "steps": int(r.steps), **{c: round(float(r[c]), 4) for c in cols}})
    doc = {"shared_decode": sh, "in_situ": rows, "profile": args.profile}
    if args.prefill is not None:
        rows = prefill_rows(args.prefill, args.profile)
        print("\n| prefilling requests | steps | tokens (median) | part | in-step / hot | cool / hot | priced / hot | "
              "priced / in-step |\n|---:|---:|---:|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['requests']}{'+' if r['requests'] == 4 else ''} | {r['steps']} | {r['tokens']} | {r['part']} | "
                  + " | ".join("-" if r[k] is None else f"{r[k]:.3f}" for k in PREFILL_RATIOS) + " |")
        doc["prefill"] = [{**{k: r[k] for k in ("requests", "part", "steps")},
                           **{k: None if r[k] is None else round(r[k], 4) for k in PREFILL_RATIOS}} for r in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
