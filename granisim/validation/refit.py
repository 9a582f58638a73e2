"""Engine corrections fitted on several machines' runs at once, every policy of one model pooled.

    granisim validation refit RUN [RUN ...] --out PROFILE.json [--model llama-3.1-8b] [--base h200]
        [--keep-from h200-engine] [--except RUN ...] [--only PREFIX ...]

``granisim validation report --profile-out`` fits one run's units of one policy; this pools the units of
every policy found in the runs (folders holding ``h200_run/`` or the units), all on ``--model``, into one
fit (granisim.calibration.engine_fit: the same keys, the same form), so that a profile can be fitted on
some machines and judged on another: ``--except`` drops runs from the list, e.g. each machine in turn for a
leave-one-machine-out check (``granisim validation report OTHER --check-profile PROFILE.json``). Held-out
workloads (VALIDATION's ``held_out``) join no fit. The profile is ``--base`` plus the fit, with the
coefficients that other fits own (``report.KEEP``, from ``--keep-from``) and the engine's host-tier
constants. ``--only PREFIX ...`` (e.g. ``engine.eager.linear``) refits just the coefficients named so: the profile
is ``--keep-from`` with those replaced by the pooled fit's values, everything else as it was. Nothing here needs a
GPU; a bad folder or a run without units is one line and exit 2.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from granisim.calibration.engine_fit import fit
from granisim.config.hardware import COEFFICIENTS, OPTIONAL_COEFFICIENTS, PROFILE_DIR, Source, get_profile
from granisim.config.models import get_model
from granisim.validation.clock_term import run_units, units_folder
from granisim.validation.report import KEEP, graph_limit, held_out, kept_coefficients, write_engine_profile
from granisim.validation.validate import reprice


def pooled_fit(runs: list[Path], model: str, base, keep) -> tuple[dict, list[str]]:
    """(engine-correction values, units fitted): every non-held-out unit of ``model`` in ``runs``, each
    re-priced with ``base`` plus ``keep`` (the coefficients the fit leaves alone)."""
    prof = replace(base, coefficients={**base.coefficients, **keep})
    m = get_model(model)
    frames, names, limits = [], [], {}
    for run in runs:
        fitted = {}
        for unit, steps, plans, unit_model in run_units(run):
            name = unit.split("/", 1)[1]
            if unit_model != model or held_out(name):
                continue
            frames.append(reprice(steps, plans, prof, m))
            names.append(unit)
            fitted[name] = steps
        if fitted:
            limits[run] = graph_limit(units_folder(run), list(fitted), fitted)
    if not frames:
        raise ValueError(f"no validation units of {model} outside the held-out workloads under "
                         f"{', '.join(map(str, runs))}")
    if len(set(limits.values())) != 1:  # the fit prices eager and graph-replayed steps apart
        raise ValueError("the runs had different CUDA-graph limits (" +
                         ", ".join(f"{r}: {g}" for r, g in limits.items()) + "); refit runs of one limit at a time")
    return fit(frames, limits.popitem()[1], m.num_layers), names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="granisim validation refit", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True, help="the profile to write (.json)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--base", default="h200", help="the microbenchmark profile the corrections go on")
    ap.add_argument("--keep-from", default="h200-engine", help="take the coefficients other fits own from it")
    ap.add_argument("--except", dest="skip", type=Path, nargs="*", default=[], help="leave these runs out")
    ap.add_argument("--only", nargs="+", metavar="PREFIX",
                    help="refit only the coefficients whose names start so; the rest from --keep-from")
    args = ap.parse_args(argv)
    if args.out.suffix != ".json":
        raise ValueError(f"--out {args.out}: a profile is a .json file")
    for run in args.runs:
        if not run.is_dir():
            raise ValueError(f"{run}: no such run folder")
    skip = {p.resolve() for p in args.skip}
    runs = [r for r in args.runs if r.resolve() not in skip]
    if not runs:
        raise ValueError(f"--except {' '.join(map(str, args.skip))}: leaves none of the runs to fit on")
    known = [*COEFFICIENTS, *OPTIONAL_COEFFICIENTS]
    for p in args.only or ():
        if not any(k.startswith(p) for k in known):
            raise ValueError(f"--only {p}: no profile coefficient is named so (e.g. engine.eager.linear)")
    base, kept_from = get_profile(args.base), get_profile(args.keep_from)
    keep = {k: kept_from.coefficients[k] for k in KEEP if k in kept_from.coefficients}
    values, units = pooled_fit(runs, args.model, base, keep)
    cmd = "granisim validation refit " + " ".join(map(str, runs)) + f" --model {args.model} --base {args.base}"
    source = Source("measured", date=datetime.now(timezone.utc).date().isoformat(), command=cmd,
                    note=f"granisim.calibration.engine_fit pooled over {len(units)} units: {', '.join(units)}")
    keep_file = Path(args.keep_from) if args.keep_from.endswith(".json") else PROFILE_DIR / f"{args.keep_from}.json"
    fitted_on = f"{len(units)} units of {len(runs)} runs"
    if args.only:
        only = only_values(values, args.only)
        source = replace(source, command=source.command + " --only " + " ".join(args.only))
        write_engine_profile(str(keep_file), only, source, args.out, {}, fitted_on)
        print(f"{args.out}: {', '.join(sorted(only))} refitted on {fitted_on}; the rest as in {args.keep_from}")
        return 0
    write_engine_profile(args.base, values, source, args.out, kept_coefficients(keep_file), fitted_on)
    print(f"{args.out}: engine corrections fitted on {fitted_on}")
    return 0


def only_values(values: dict[str, float], prefixes: list[str]) -> dict[str, float]:
    """The fitted values whose names start with one of ``prefixes`` (``engine.eager.linear`` takes its scale,
    offset and floor); ValueError for a prefix that names none (pure)."""
    out = {k: v for k, v in values.items() if any(k.startswith(p) for p in prefixes)}
    for p in prefixes:
        if not any(k.startswith(p) for k in out):
            raise ValueError(f"--only {p}: the fit has no coefficient named so (it fits {', '.join(sorted(values))})")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
