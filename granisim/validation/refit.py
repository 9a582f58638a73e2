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
is ``--keep-from`` with those replaced by the pooled fit's values, everything else as it was. The factor on eager
steps that prefill several requests (``engine.eager.attn_prefill.multi_gain`` / ``multi_cached``:
`fit_multi_prefill`) is fitted only when ``--only`` names it, on the eager prefill correction the profile will carry
(``--keep-from``'s), and may pool several ``--model``s (it is a ratio); so are the scales of the prefill and prefix
attention of steps with prefill work (``engine.attn_in_step.*``: `fit_attn_in_step`, on ``--keep-from``'s prices
without them). The host terms (``overhead.*``) are not fitted
across runs of two engine host paths (ids listed each step, or read through the request table: `host_paths`).
Nothing here needs a GPU; a bad folder or a run without units is one line and exit 2.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.calibration.engine_fit import fit
from granisim.config.hardware import COEFFICIENTS, OPTIONAL_COEFFICIENTS, PROFILE_DIR, Source, get_profile, with_values
from granisim.config.files import read_json
from granisim.config.models import get_model
from granisim.costmodel import cost_tables
from granisim.costmodel.step import self_share
from granisim.validation.clock_term import run_units, units_folder
from granisim.validation.report import KEEP, graph_limit, held_out, kept_coefficients, write_engine_profile
from granisim.validation.validate import reprice
from granisim.config.files import OneLineParser


MULTI = "engine.eager.attn_prefill.multi"  # the prefix of the factor's coefficients (gain, cached share)
IN_STEP = "engine.attn_in_step"  # the prefix of the scales of attention between a step's GEMMs (self, context, per 1K)
IN_STEP_KEYS = tuple(f"{IN_STEP}.{k}" for k in ("self_scale", "context_scale", "context_per_ktok"))
IN_STEP_NONE = dict(zip(IN_STEP_KEYS, (1.0, 1.0, 0.0)))  # priced as alone


def pooled_frames(runs: list[Path], model: str, base, keep) -> tuple[list[pd.DataFrame], list[str], int]:
    """(steps, units, CUDA-graph limit): every non-held-out unit of ``model`` in ``runs``, each re-priced with
    ``base`` plus ``keep`` (the coefficients the fit leaves alone), with each step's prefilling requests
    (``prefill_requests``) and whether every one of them reads cached context (``prefill_cached``)."""
    prof = replace(base, coefficients={**base.coefficients, **keep})
    m = get_model(model)
    frames, names, limits = [], [], {}
    for run in runs:
        fitted = {}
        for unit, steps, plans, unit_model in run_units(run):
            name = unit.split("/", 1)[1]
            if unit_model != model or held_out(name):
                continue
            pf = [[r for r in p.requests if r.is_prefill] for p in plans]
            frames.append(reprice(steps, plans, prof, m).assign(
                prefill_requests=[len(r) for r in pf],
                prefill_cached=[bool(r) and all(q.context_len > 0 for q in r) for r in pf]))
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
    return frames, names, limits.popitem()[1]


def pooled_fit(runs: list[Path], model: str, base, keep) -> tuple[dict, list[str]]:
    """(engine-correction values, units fitted): every non-held-out unit of ``model`` in ``runs``, each
    re-priced with ``base`` plus ``keep`` (the coefficients the fit leaves alone)."""
    frames, names, graph_max = pooled_frames(runs, model, base, keep)
    return fit(frames, graph_max, get_model(model).num_layers), names


def fit_multi_prefill(steps: pd.DataFrame, graph_max: int) -> dict[str, float]:
    """``engine.eager.attn_prefill.multi_gain`` and ``multi_cached`` from re-priced steps whose
    ``predicted_attn_prefill`` is the kernel's time alone (no engine correction) and whose ``scale`` and
    ``offset`` columns are the eager prefill correction the profile carries (offset per step, for the step's model's
    layers): measured = scale * factor * predicted + offset over the eager steps that prefill two requests or more,
    factor = 1 + g (n - 1) / n. Least squares on the relative error; g is ``multi_gain`` on steps where a request
    prefills without cached context and ``multi_cached * multi_gain`` where every one reads cached context (the two
    kinds of steps fit apart); gain >= 0, share within [0, 1]; share 1 (no distinction) without such steps (pure)."""
    df = steps[(steps["tokens"] > graph_max) & (steps["prefill_requests"] >= 2)
               & (steps["measured_attn_prefill"] > 0) & (steps["predicted_attn_prefill"] > 0)]
    if not len(df):
        raise ValueError(f"{MULTI}_gain: no eager step (over {graph_max} tokens) prefills two requests or more")
    n = df["prefill_requests"].to_numpy(float)
    y = df["measured_attn_prefill"].to_numpy(float)
    base = df["scale"].to_numpy(float) * df["predicted_attn_prefill"].to_numpy(float)
    x = base * (n - 1) / n  # d(price) / d(g)
    r = y - base - df["offset"].to_numpy(float)  # what the factor has to add

    def lsq(m: np.ndarray) -> float | None:  # argmin_g sum(((g x - r) / y)^2) over the steps m
        if not m.any():
            return None
        xw, rw = x[m] / y[m], r[m] / y[m]
        return float((xw * rw).sum() / (xw * xw).sum())

    cached = df["prefill_cached"].to_numpy(bool)
    g_fresh, g_cached = lsq(~cached), lsq(cached)
    if g_fresh is None:  # every step reads cached context: one gain for them all
        return {f"{MULTI}_gain": max(0.0, g_cached), f"{MULTI}_cached": 1.0}
    gain = max(0.0, g_fresh)
    share = 1.0 if g_cached is None or gain == 0 else min(1.0, max(0.0, g_cached / gain))
    return {f"{MULTI}_gain": gain, f"{MULTI}_cached": share}


def multi_prefill_values(runs: list[Path], models: list[str], base, keep, target) -> tuple[dict, list[str]]:
    """(``fit_multi_prefill``'s values, units fitted) over the runs' units of every model in ``models``, each step
    with ``target``'s eager prefill correction (its scale, and its offset scaled to the model's layers)."""
    frames, names, limits = [], [], set()
    for model in models:
        f, n, g = pooled_frames(runs, model, base, keep)
        scale, offset = cost_tables(target, get_model(model)).engine_eager["attn_prefill"]  # as the cost model prices
        frames += [x.assign(scale=scale, offset=offset) for x in f]
        names += n
        limits.add(g)
    if len(limits) != 1:
        raise ValueError(f"the models' runs had different CUDA-graph limits ({sorted(limits)}); fit one at a time")
    return fit_multi_prefill(pd.concat(frames, ignore_index=True), limits.pop()), names


def fit_attn_in_step(steps: pd.DataFrame) -> dict[str, float]:
    """``engine.attn_in_step.*`` from re-priced steps priced without them: over the steps with prefill work
    (``prefill_requests`` > 0) whose prefill and prefix attention both sides measured, measured = a w P + (b + s T /
    1000) ((1 - w) P + X), with P the prefill attention's price, X the prefix passes', w its share over the requests'
    own tokens (``self_share``) and T the step's tokens. Least squares on the seconds (a step weighs what its
    attention costs); s >= 0 (refitted with s = 0 where it comes out negative); a, b > 0 or ValueError (pure)."""
    y = (steps["measured_attn_prefill"] + steps["measured_attn_prefix"]).to_numpy(float)
    pf, px = (steps[f"predicted_{k}"].to_numpy(float) for k in ("attn_prefill", "attn_prefix"))
    m = (steps["prefill_requests"].to_numpy() > 0) & (y > 0) & (pf + px > 0)
    if not m.any():
        raise ValueError(f"{IN_STEP}: no step with prefill work measured its prefill attention")
    w = steps["self_share"].to_numpy(float)[m]
    own, context = w * pf[m], (1.0 - w) * pf[m] + px[m]
    x = np.column_stack([own, context, context * steps["tokens"].to_numpy(float)[m] / 1000.0])
    a, b, s = np.linalg.lstsq(x, y[m], rcond=None)[0]
    if s < 0:
        (a, b), s = np.linalg.lstsq(x[:, :2], y[m], rcond=None)[0], 0.0
    if not (a > 0 and b > 0):
        raise ValueError(f"{IN_STEP}: the fit gives self_scale {a:.3g}, context_scale {b:.3g}: not positive")
    return dict(zip(IN_STEP_KEYS, (float(a), float(b), float(s))))


def prefill_shares(plans: list) -> tuple[list[int], list[float]]:
    """Per plan: the requests it prefills and their prefill attention's share over their own tokens (``self_share``)."""
    rows = [[i for i, r in enumerate(p.requests) if r.is_prefill] for p in plans]
    return [len(i) for i in rows], [self_share([r.num_new for r in p.requests], [r.context_len for r in p.requests], i)
                                    for p, i in zip(plans, rows)]


def attn_in_step_values(runs: list[Path], models: list[str], target) -> tuple[dict, list[str]]:
    """(``fit_attn_in_step``'s values, units fitted) over the runs' non-held-out units of every model in ``models``,
    each priced by ``target`` without the scales."""
    bare = with_values(target, IN_STEP_NONE)
    frames, names = [], []
    for run in runs:
        for unit, steps, plans, model in run_units(run):
            if model not in models or held_out(unit.split("/", 1)[1]):
                continue
            n_pf, share = prefill_shares(plans)
            frames.append(reprice(steps, plans, bare, get_model(model)).assign(prefill_requests=n_pf, self_share=share))
            names.append(unit)
    if not frames:
        raise ValueError(f"no validation units of {', '.join(models)} outside the held-out workloads under "
                         f"{', '.join(map(str, runs))}")
    return fit_attn_in_step(pd.concat(frames, ignore_index=True)), names


def host_paths(runs: list[Path]) -> dict[str, list[str]]:
    """The engine host path each run's units measured, by the executor's stats in their validation JSON: "request
    table" (decode rows read through the engine's request table) or "listed ids" (every id listed each step: the
    engine before it, whose runs carry no such stat) -> the units' JSON files."""
    out: dict[str, list[str]] = {}
    for run in runs:
        for path in sorted(units_folder(run).glob("validation_*.json")):
            stats = read_json(path).get("executor") or {}
            out.setdefault("request table" if stats.get("request_table") else "listed ids", []).append(str(path))
    return out


def check_one_host_path(runs: list[Path], only: list[str]) -> None:
    """ValueError when a fit of the host terms (``overhead.*``: the whole fit, or an ``--only`` naming them) would
    pool runs of two host paths: the terms describe one engine's host work."""
    if only and not any(p.startswith("overhead") or "overhead.".startswith(p) for p in only):
        return
    paths = host_paths(runs)
    if len(paths) > 1:
        raise ValueError("the runs measured two engine host paths (" + "; ".join(
            f"{k}: {v[0]}{f' and {len(v) - 1} more' if len(v) > 1 else ''}" for k, v in sorted(paths.items()))
            + "); overhead.* describe one: refit on the runs of one, or --only coefficients other than overhead.")


def runs_to_fit(args) -> list[Path]:
    """A fit's run folders: ``args.runs`` less ``args.skip`` (--except), each a folder; ``args.out`` a .json."""
    if args.out.suffix != ".json":
        raise ValueError(f"--out {args.out}: a profile is a .json file")
    for run in args.runs:
        if not run.is_dir():
            raise ValueError(f"{run}: no such run folder")
    skip = {p.resolve(): p for p in args.skip}
    runs = [r for r in args.runs if r.resolve() not in skip]
    stray = set(skip) - {r.resolve() for r in args.runs}  # a mistyped name would make a held-out fit in-sample
    if stray:
        raise ValueError(f"--except {skip[min(stray)]}: not one of the runs given "
                         f"({' '.join(map(str, args.runs))[:160]})")
    if not runs:
        raise ValueError(f"--except {' '.join(map(str, args.skip))}: leaves none of the runs to fit on")
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="granisim validation refit", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True, help="the profile to write (.json)")
    ap.add_argument("--model", nargs="+", default=["llama-3.1-8b"],
                    help=f"the model whose units are fitted (several only for --only {MULTI})")
    ap.add_argument("--base", default="h200", help="the microbenchmark profile the corrections go on")
    ap.add_argument("--keep-from", default="h200-engine", help="take the coefficients other fits own from it")
    ap.add_argument("--except", dest="skip", type=Path, nargs="*", default=[], help="leave these runs out")
    ap.add_argument("--only", nargs="+", metavar="PREFIX",
                    help="refit only the coefficients whose names start so; the rest from --keep-from")
    args = ap.parse_args(argv)
    known = [*COEFFICIENTS, *OPTIONAL_COEFFICIENTS]
    for p in args.only or ():  # the options first, then the runs they would fit
        if not p.strip():
            raise ValueError(f"--only {p!r}: an empty prefix names every coefficient; leave --only out for that")
        if not any(k.startswith(p) for k in known):
            raise ValueError(f"--only {p}: no profile coefficient is named so (e.g. engine.eager.linear)")
    runs = runs_to_fit(args)
    base, kept_from = get_profile(args.base), get_profile(args.keep_from)
    keep = {k: kept_from.coefficients[k] for k in KEEP if k in kept_from.coefficients}
    only = args.only or []
    check_one_host_path(runs, only)
    multi_alone = bool(only) and all(p.startswith(MULTI) for p in only)  # the factor and nothing else
    in_step_alone = bool(only) and all(p.startswith(IN_STEP) for p in only)  # the scales and nothing else
    if len(args.model) > 1 and not (multi_alone or in_step_alone):
        raise ValueError(f"--model {' '.join(args.model)}: several models are pooled only for --only {MULTI} "
                         f"or {IN_STEP}")
    if multi_alone:
        values, units = multi_prefill_values(runs, args.model, base, keep, kept_from)
        how = "granisim.validation.refit.fit_multi_prefill"
    elif in_step_alone:
        values, units = attn_in_step_values(runs, args.model, kept_from)
        how = "granisim.validation.refit.fit_attn_in_step"
    else:
        values, units = pooled_fit(runs, args.model[0], base, keep)
        how = "granisim.calibration.engine_fit"
        if any(MULTI.startswith(p) for p in only):
            values.update(multi_prefill_values(runs, args.model, base, keep, kept_from)[0])
    cmd = ("granisim validation refit " + " ".join(map(str, runs)) + f" --model {' '.join(args.model)}"
           f" --base {args.base}")
    source = Source("measured", date=datetime.now(timezone.utc).date().isoformat(), command=cmd,
                    note=f"{how} pooled over {len(units)} units: {', '.join(units)}")
    keep_file = Path(args.keep_from) if args.keep_from.endswith(".json") else PROFILE_DIR / f"{args.keep_from}.json"
    fitted_on = f"{len(units)} units of {len(runs)} runs"
    if args.only:
        only = only_values(values, args.only)
        source = replace(source, command=source.command + " --only " + " ".join(args.only))
        write_engine_profile(args.keep_from, only, source, args.out, {}, fitted_on)
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
