"""Step-class factors fitted on several machines' validation runs: the engine's time over the price, per class.

    granisim validation step-classes RUN [RUN ...] --out PROFILE.json [--base h200-engine] [--except RUN ...]
        [--min-steps 20]

Every unit of the runs (every model and policy found; held-out workloads join no fit) is re-priced with
``--base`` (its own step-class factors left off) and its steps classed as the cost model classes them
(granisim/costmodel/step_classes.py: decode by batch, prefill by tokens, prefilling requests and cached or fresh
context). A class's factor is the measured seconds over the priced seconds summed over its steps of one model and
policy; classes with fewer than ``--min-steps`` steps get none (priced as the base prices them). The profile written
is ``--base`` with these factors as its ``step_classes``, named by the file. ``--except`` leaves runs out, e.g. each
machine in turn for a leave-one-machine-out check (``granisim validation judge PROFILE.json THAT_RUN``). Prints the
factors; nothing here needs a GPU; a bad folder or a run without units is one line and exit 2.
"""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path


from granisim.config.files import OneLineParser
from granisim.config.hardware import PROFILE_DIR, get_profile
from granisim.config.profile_base import derived
from granisim.config.models import get_model
from granisim.costmodel.step_classes import CLASSES, plan_class, policy_key
from granisim.validation.clock_term import run_units
from granisim.validation.refit import runs_to_fit
from granisim.validation.report import held_out
from granisim.validation.validate import reprice

MIN_STEPS = 1


def class_sums(runs: list[Path], base) -> tuple[dict, list[str]]:
    """({(model, policy, class): [measured s, priced s, steps]}, units summed) over the non-held-out units of
    ``runs``, priced with ``base`` without its step-class factors."""
    bare = replace(base, step_classes=None)
    sums: dict[tuple[str, str, str], list] = {}
    units = []
    for run in runs:
        for unit, steps, plans, model in run_units(run):
            if held_out(unit.split("/", 1)[1]) or not plans:
                continue
            priced = reprice(steps, plans, bare, get_model(model))
            policy = policy_key(plans[0])
            for cls, m, p in zip(map(plan_class, plans), priced["measured_s"], priced["predicted_s"]):
                acc = sums.setdefault((model, policy, cls), [0.0, 0.0, 0])
                acc[0] += m
                acc[1] += p
                acc[2] += 1
            units.append(unit)
    if not units:
        raise ValueError(f"no validation units outside the held-out workloads under {', '.join(map(str, runs))}")
    return sums, units


def factors(sums: dict, min_steps: int = MIN_STEPS) -> dict[str, dict[str, dict[str, float]]]:
    """model -> policy -> class -> measured / priced, for classes of at least ``min_steps`` steps (pure)."""
    out: dict = {}
    for (model, policy, cls), (measured, priced, n) in sorted(sums.items()):
        if n >= min_steps and priced > 0 and measured > 0:
            out.setdefault(model, {}).setdefault(policy, {})[cls] = round(measured / priced, 4)
    return out


def table(sums: dict, fitted: dict) -> str:
    lines = ["| model | policy | class | steps | measured s | factor |", "| --- | --- | --- | ---: | ---: | ---: |"]
    order = {c: i for i, c in enumerate(CLASSES)}
    for (model, policy, cls), (measured, _, n) in sorted(sums.items(), key=lambda kv: (*kv[0][:2], order[kv[0][2]])):
        f = fitted.get(model, {}).get(policy, {}).get(cls)
        lines.append(f"| {model} | {policy} | {cls} | {n} | {measured:.2f} | {'-' if f is None else f'{f:.3f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="granisim validation step-classes", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run folders (each holding h200_run/ or the units)")
    ap.add_argument("--out", type=Path, required=True, help="the profile to write (.json)")
    ap.add_argument("--base", default="h200-engine", help="the profile the factors go on (default h200-engine)")
    ap.add_argument("--except", dest="skip", type=Path, nargs="*", default=[], help="leave these runs out")
    ap.add_argument("--min-steps", type=int, default=MIN_STEPS, help=f"fewest steps a class needs (default {MIN_STEPS})")
    args = ap.parse_args(argv)
    if args.min_steps < 1:
        raise ValueError(f"--min-steps {args.min_steps}: give 1 or more")
    runs = runs_to_fit(args)
    base = get_profile(args.base)
    sums, units = class_sums(runs, base)
    fitted = factors(sums, args.min_steps)
    print(table(sums, fitted), end="")
    notes = (f"{args.base} with step-class factors (engine time over its price per model, policy and class of "
             f"step) fitted on real-engine validation runs; models and policies without factors are priced as "
             f"{args.base} prices them. {args.base}'s notes: {base.notes}")
    doc = derived(args.base, args.out, PROFILE_DIR, name=args.out.stem, notes=notes)  # the factors on its base
    cmd = (f"granisim validation step-classes {' '.join(map(str, runs))} --base {args.base} "
           f"--min-steps {args.min_steps}")
    doc["step_classes"] = {"factors": fitted, "source": {
        "kind": "measured", "date": datetime.now(timezone.utc).date().isoformat(), "command": cmd,
        "note": f"engine seconds over {args.base}'s price summed per model, policy and class of step over "
                f"{len(units)} validation units of {', '.join(sorted({u.split('/', 1)[0] for u in units}))} "
                f"(held-out workloads left out)"}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    get_profile(str(args.out))  # the written profile loads, or a one-line ProfileError
    n = sum(len(c) for by_policy in fitted.values() for c in by_policy.values())
    print(f"{args.out}: {n} step-class factors fitted on {len(units)} units of {len(runs)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
