"""Prefill attention inside the engine's steps against its price, by the step's tokens and cached context, with and
without the scales engine.attn_in_step.*.

    python reports/validation/current_engine/attn_in_step.py RAW/validation/runZ3=h200-engine \\
        RAW/validation/h100_Z4=h100-carried.json RAW/validation/h100_Z2=h100-carried.json \\
        --out reports/validation/current_engine/attn_in_step.json

Each RUN=PROFILE pair is a validation run folder and the profile that prices it (``h100-carried.json``: `granisim
profile carry h200-engine --onto h100-sxm --out h100-carried.json`). Every step with prefill work of every unit is
re-priced with the profile as it is and without the scales; per run, model and bin of the step's new tokens:
the steps, and price / measured of their prefill and prefix attention summed (1: priced right; below 1: the
engine's attention took longer than priced), and the scales fitted on that run and model alone
(granisim.validation.refit.fit_attn_in_step); then, over all the runs, the same by bin of step tokens and of the
cached context the prefilling requests read (their mean, weighted by their new tokens). And per run and model, the
decode attention of the same steps where it reads short contexts (every policy's `control_short`, granikv's suffixes
everywhere): its measured time less its price, per 1,000 step tokens and per layer (``decode_extra``). Needs no GPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from granisim.config.hardware import get_profile, with_values
from granisim.config.models import get_model
from granisim.validation.clock_term import run_units
from granisim.validation.refit import IN_STEP_KEYS, IN_STEP_NONE, fit_attn_in_step, prefill_shares
from granisim.validation.validate import reprice

BINS = (0, 512, 2048, 4096, 8191, 8192)  # 8192: a full chunk (the engine's token budget)
PARTS = ("attn_prefill", "attn_prefix")
CONTEXT_BINS = (-1, 256, 4096, float("inf"))  # cached tokens the prefilling requests read
CONTEXT_LABELS = ("<= 256", "257-4096", "> 4096")
TOKEN_LABELS = [f"{lo + 1}-{hi}" for lo, hi in zip(BINS, BINS[1:])]


def prefill_steps(run: Path, profile) -> pd.DataFrame:
    """Steps with prefill work of every unit in ``run``: model, tokens and their bin, cached context and its bin, the
    attention parts measured and priced without the scales, and the attention measured (``measured``), priced
    without (``without``) and with the scales (``with``)."""
    bare = with_values(profile, IN_STEP_NONE)
    rows = []
    for unit, steps, plans, model in run_units(run):
        n_pf, share = prefill_shares(plans)
        ctx = [sum(r.context_len * r.num_new for r in p.requests if r.is_prefill)
               / max(1, sum(r.num_new for r in p.requests if r.is_prefill)) for p in plans]
        a, b = (reprice(steps, plans, prof, get_model(model)) for prof in (profile, bare))
        df = pd.DataFrame({"model": model, "tokens": a["tokens"], "prefill_requests": n_pf, "context": ctx,
                           "self_share": share,
                           **{f"measured_{k}": a[f"measured_{k}"] for k in PARTS},
                           **{f"predicted_{k}": b[f"predicted_{k}"] for k in PARTS},
                           "measured": sum(a[f"measured_{k}"] for k in PARTS),
                           "without": sum(b[f"predicted_{k}"] for k in PARTS),
                           "with": sum(a[f"predicted_{k}"] for k in PARTS),
                           "short_decode": unit.split("/", 1)[1].startswith("control_short_") or "_granikv_" in unit,
                           "measured_attn_decode": a["measured_attn_decode"],
                           "predicted_attn_decode": a["predicted_attn_decode"]})
        rows.append(df[df.prefill_requests > 0])
    out = pd.concat(rows, ignore_index=True)
    return out.assign(token_bin=pd.cut(out.tokens, BINS, labels=TOKEN_LABELS),
                      context_bin=pd.cut(out.context, CONTEXT_BINS, labels=CONTEXT_LABELS))


def _ratios(g: pd.DataFrame) -> dict:
    """Price / measured of a group's attention, without and with the scales (pure)."""
    return {k: round(float(g[k].sum() / g.measured.sum()), 3) for k in ("without", "with")}


def table(steps: pd.DataFrame) -> list[dict]:
    """Per model and bin of step tokens: the steps and their ratios, then the scales fitted on the model's steps."""
    out = []
    for model, g in steps.groupby("model"):
        for label, h in g.groupby("token_bin", observed=True):
            out.append({"model": model, "tokens": str(label), "steps": int(len(h)), **_ratios(h)})
        fit = fit_attn_in_step(g)
        out.append({"model": model, "tokens": "fit", "steps": int(len(g)),
                    "fit": {k.rsplit(".", 1)[1]: round(fit[k], 4) for k in IN_STEP_KEYS}})
    return out


def by_context(steps: pd.DataFrame) -> list[dict]:
    """Per model, bin of step tokens and bin of cached context: the steps and their ratios (pure)."""
    return [{"model": model, "tokens": str(tok), "context": str(c), "steps": int(len(g)), **_ratios(g)}
            for (model, tok, c), g in steps.groupby(["model", "token_bin", "context_bin"], observed=True)]


def decode_extra(steps: pd.DataFrame) -> list[dict]:
    """Per model, over the steps whose decode reads short contexts: the decode attention's measured time less its
    price, in ms per 1,000 step tokens and in us per layer per 1,000 tokens (pure but for the model's layers)."""
    out = []
    for model, g in steps[steps.short_decode].groupby("model"):
        per_ktok_ms = float((g.measured_attn_decode - g.predicted_attn_decode).sum() / g.tokens.sum() * 1e6)
        out.append({"model": model, "steps": int(len(g)), "ms_per_1k_tokens": round(per_ktok_ms, 4),
                    "us_per_layer_per_1k_tokens": round(per_ktok_ms * 1e3 / get_model(model).num_layers, 3)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="RUN=PROFILE")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    doc, pooled = {}, []
    for item in args.runs:
        run, _, prof = item.partition("=")
        profile = get_profile(prof)
        steps = prefill_steps(Path(run), profile)
        pooled.append(steps)
        scales = {k.rsplit(".", 1)[1]: profile[k] for k in IN_STEP_KEYS}
        doc[Path(run).name] = {"profile": Path(prof).name, "scales": scales, "rows": table(steps),
                               "decode_extra": decode_extra(steps)}
        print(f"{Path(run).name} ({Path(prof).name}: " + ", ".join(f"{k} {v:.4f}" for k, v in scales.items()) + ")")
        print("| model | step tokens | steps | price / measured without | with |")
        print("| --- | --- | ---: | ---: | ---: |")
        for r in doc[Path(run).name]["rows"]:
            if r["tokens"] == "fit":
                print(f"| {r['model']} | this run's own fit | {r['steps']} | " + ", ".join(
                    f"{k} {v:.4f}" for k, v in r["fit"].items()) + " | |")
            else:
                print(f"| {r['model']} | {r['tokens']} | {r['steps']} | {r['without']:.3f} | {r['with']:.3f} |")
        for r in doc[Path(run).name]["decode_extra"]:
            print(f"{r['model']}: short-context decode in these steps {r['ms_per_1k_tokens']:.3f} ms over its price per "
                  f"1,000 step tokens ({r['us_per_layer_per_1k_tokens']:.2f} us a layer; {r['steps']} steps)")
    doc["by_context"] = by_context(pd.concat(pooled, ignore_index=True))
    print("all runs, by cached context")
    print("| model | step tokens | cached context | steps | price / measured without | with |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for r in doc["by_context"]:
        print(f"| {r['model']} | {r['tokens']} | {r['context']} | {r['steps']} | {r['without']:.3f} | "
              f"{r['with']:.3f} |")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
