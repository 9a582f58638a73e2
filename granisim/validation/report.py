"""Validation report from a real-engine run (``granisim validation gpu-run validate --out RUN``), no GPU needed.

    granisim validation report RUN --out OUT [--profile-out granisim/config/profiles/h200-engine.json]

For every workload of the run, with the CURRENT cost model (the run's stored plans re-priced,
so a model change needs no new GPU run): the errors with the microbenchmark profile, then with
the engine-calibrated model (granisim.calibration.engine_fit) fitted on the OTHER workloads only
(leave one workload out), then fitted on all (in sample). A workload marked ``held_out`` in
VALIDATION (the long-prompt replay at 500 requests) joins no fit, not even --profile-out's: it is
judged by fits on the others only, and listed under ``held_out`` in the report. --policy and
--model pick the units of one policy and model (default granikv on llama-3.1-8b). Per-step errors by re-pricing the
stored plans, end-to-end errors by re-running the simulator alone. --profile-out writes the
base profile plus the fit on all workloads as a new profile (shipped: `h200-engine`); --fit-runs
pools more runs' steps into that fit.
--check-profile NAME adds the errors of an existing profile as it stands (e.g. the shipped `h200-engine`,
fitted on another run: a check across runs).
"""
from __future__ import annotations

import json

from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]

from granisim.validation.gpu_runs import HELD_OUT, VALIDATION, split_unit, unit_name, validation_scenario
from granisim.calibration.engine_fit import ENGINE_HOST_DUPLEX, ENGINE_HOST_OVERLAP, fit, host_work, unit_of, with_engine
from granisim.config.hardware import PROFILE_DIR, Source, get_profile, profile_json
from granisim.config.profile_base import derived
from granisim.config.models import get_model
from granisim.core.metrics import requests_frame, summarize
from granisim.experiments.run import prepare, simulate
from granisim.costmodel.host_build import after_each
from granisim.validation.plans import load_plans
from granisim.validation.validate import TARGETS, end_to_end, percentile_errors, reprice, step_errors
from granisim.config.files import OneLineParser, read_json


def _setup(name: str, requests: int, profile: str):
    """The scenario a unit (a workload name, or a unit name with policy and model) ran."""
    w, pol, model = split_unit(name) or (name, "granikv", "llama-3.1-8b")
    return prepare(validation_scenario(w, requests, profile, pol, model))


def held_out(name: str) -> bool:
    """A unit of the workload kept out of every fit (VALIDATION's ``held_out``)."""
    return (split_unit(name) or (name,))[0] in HELD_OUT


def run_requests(workload_dir: Path, base: str, given: int | None = None) -> int:
    """The request count a validation run measured for workload ``base`` (its folder ``workload_dir``): the
    simulator must run the same scenario. Every request is in measured_requests.parquet; a --requests that
    disagrees with it is an error, not a silent prediction of another scenario."""
    path = workload_dir / "measured_requests.parquet"
    if not path.exists():
        if given is None:
            raise ValueError(f"{path}: missing, and no --requests given (the request count of the run)")
        return given
    wl = VALIDATION[(split_unit(base) or (base,))[0]]["workload"]
    if wl.get("turns", 1) > 1:  # num_requests counts sessions (first turns); every turn is a request of its own
        n = int((pd.read_parquet(path, columns=["turn"]).turn == 0).sum())
    else:
        n = len(pd.read_parquet(path, columns=["rid"]))
    asked = min(wl["num_requests"], given) if given is not None else n
    if asked != n:
        raise ValueError(f"{path}: the run measured {n} requests, --requests {given} would simulate {asked}; "
                         "leave --requests out to use the run's own count")
    return n


def graph_limit(run: Path, names: list[str], steps: dict[str, pd.DataFrame]) -> int:
    """The CUDA-graph row limit a run's executor had (steps of more tokens ran eagerly): its stats' ``graph_max_rows``,
    or, in runs from before the stats carried it, the limit among those the engine has had (512, 2048) that
    leaves exactly the run's eager steps. Every workload of the run must agree."""
    limits = set()
    for n in names:
        path = run / f"validation_{n}.json"
        stats = read_json(path).get("executor") or {}
        if "graph_max_rows" in stats:
            limits.add(int(stats["graph_max_rows"]))
            continue
        tokens = steps[n]["tokens"]
        match = [g for g in (512, 2048) if int((tokens > g).sum()) == stats.get("eager_steps")]
        if len(match) != 1:
            raise ValueError(f"{path}: executor.graph_max_rows missing, and eager_steps = "
                             f"{stats.get('eager_steps')} fits {len(match)} of the known limits (512, 2048)")
        limits.add(match[0])
    if len(limits) != 1:
        raise ValueError(f"{run}: workloads ran with different graph limits {sorted(limits)}")
    return limits.pop()


def _e2e(setup, measured: dict, measured_requests: Path) -> dict:
    """The simulator alone on `setup` against the run: {"end_to_end": ...} and, where the run kept its
    per-request records, "percentile_errors" (the latency percentiles peers report)."""
    res = simulate(setup, progress=False)
    predicted = requests_frame(res.records)
    out = {"end_to_end": end_to_end({k: v["measured"] for k, v in measured.items()},
                                    summarize(predicted, res.steps.frame(), res.end_s))}
    if measured_requests.exists():
        out["percentile_errors"] = percentile_errors(pd.read_parquet(measured_requests), predicted)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation report", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile-out", type=Path)
    ap.add_argument("--requests", type=int, help="the run's request cap (default: as the run measured)")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--check-profile", help="also judge this profile as it stands (fitted on another run)")
    ap.add_argument("--policy", default="granikv", help="the units of this policy (default granikv)")
    ap.add_argument("--model", default="llama-3.1-8b", help="the units of this model (default llama-3.1-8b)")
    ap.add_argument("--fit-runs", type=Path, nargs="*", default=[],
                    help="more runs whose steps join this run's in the --profile-out fit (not in the per-run variants)")
    args = ap.parse_args(argv)
    variants = VARIANTS + ((("check_profile", f"{args.check_profile} as it stands"),) if args.check_profile else ())
    for run in (args.run, *args.fit_runs):
        if not run.is_dir():  # not 'no unit of granikv ... to fit on', which sends one looking inside it
            raise ValueError(f"{run}: no such run folder (granisim validation gpu-run validate --out RUN writes one)")
    names, steps, plans = _load(args.run, args.policy, args.model)
    fitted = [n for n in names if not held_out(n)]
    if not fitted:
        raise ValueError(f"{args.run}: no unit of {args.policy} on {args.model} outside the held-out workloads "
                         f"({', '.join(HELD_OUT)}) to fit on")
    limit = graph_limit(args.run, names, steps)
    raw = {n: read_json(args.run / f"validation_{n}.json") for n in names}
    meta = {k: (args.run.parent / f"{k}.txt").read_text().strip() for k in ("commit", "versions")
            if (args.run.parent / f"{k}.txt").exists()}
    source = Source("measured", date=raw[names[0]]["date"],
                    command=f"scripts/engine_h200.py validate (H200, commit {meta.get('commit', '?')}); "
                            f"python scripts/validation_report.py {args.run}"
                            + (" --fit-runs " + " ".join(map(str, args.fit_runs)) if args.fit_runs else "")
                            + " --profile-out ...",
                    note="granisim.calibration.engine_fit fit on the real engine's validation runs "
                         f"({', '.join(names)}): key time = scale * model + offset per launch (linear: by step size); "
                         "overhead per step + per request + per KV token + per prefix pass")
    report = {"run": {"date": raw[names[0]]["date"], **meta, "device": raw[names[0]]["device"], "dir": str(args.run)},
              "policy": args.policy, "model": args.model, "targets": TARGETS, "workloads": {},
              "held_out": [n for n in names if held_out(n)]}  # units kept out of every fit, judged on their own
    setups = {n: _setup(n, run_requests(args.run / n, n, args.requests), args.profile) for n in names}
    base = {n: reprice(steps[n], plans[n], setups[n].profile, setups[n].model) for n in names}
    kept = kept_coefficients(args.profile_out)
    pooled = [base[n] for n in fitted]
    for run in args.fit_runs:
        more_names, more_steps, more_plans = _load(run, args.policy, args.model)
        if graph_limit(run, more_names, more_steps) != limit:
            raise ValueError(f"{run}: another CUDA-graph limit than {args.run}'s ({limit} rows): "
                             "its steps cannot join one fit")
        s0 = setups[names[0]]  # one profile and model for every unit of the policy and model
        pooled += [reprice(more_steps[n], more_plans[n], s0.profile, s0.model) for n in more_names if not held_out(n)]
    layers = get_model(args.model).num_layers
    report["fit_all"] = fit(pooled, limit, layers)
    if args.fit_runs:
        report["fit_all_runs"] = [str(args.run), *map(str, args.fit_runs)]
    frames = []
    for n in names:
        setup = setups[n]
        measured = raw[n]["end_to_end"]
        mreq = args.run / n / "measured_requests.parquet"
        report["workloads"][n] = {"steps": int(len(base[n])), "executor": raw[n].get("executor"),
                                  "held_out": held_out(n), "idle": raw[n].get("idle"),
                                  "host_probe": raw[n].get("host_probe"),
                                  "at_run_time": {"step_errors": raw[n]["step_errors"], "end_to_end": measured},
                                  "microbenchmark_profile": {"step_errors": step_errors(base[n]),
                                                             **_e2e(setup, measured, mreq)}}
        for label, on in (("engine_calibrated_held_out", [o for o in fitted if o != n]),
                          ("engine_calibrated_in_sample", fitted)):
            if not on:  # the run's only fitted workload: nothing else of it to hold this one out of
                report["workloads"][n][label] = None
                continue
            vals = fit([base[o] for o in on], limit, layers)
            prof = with_engine(setup.profile, vals, source)
            cal = reprice(steps[n], plans[n], prof, setup.model)
            report["workloads"][n][label] = {"fitted_on": on, "coefficients": vals, "step_errors": step_errors(cal),
                                             **_e2e(replace(setup, profile=prof), measured, mreq)}
            if label == "engine_calibrated_held_out":
                frames.append(cal.assign(workload=n))
        if args.check_profile:
            prof = get_profile(args.check_profile)
            report["workloads"][n]["check_profile"] = {
                "profile": args.check_profile, "step_errors": step_errors(reprice(steps[n], plans[n], prof, setup.model)),
                **_e2e(replace(setup, profile=prof), measured, mreq)}
        print(n, {k: json.dumps(report["workloads"][n][k]["step_errors"]["total"]) for k in
                  ("microbenchmark_profile", "engine_calibrated_held_out", "engine_calibrated_in_sample")
                  if report["workloads"][n][k] is not None})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "h200.json").write_text(json.dumps(report, indent=1, separators=(",", ":")) + "\n")
    (args.out / "h200_tables.md").write_text(_tables(report, variants))
    if frames:
        pd.concat(frames).to_parquet(args.out / "h200_steps.parquet", index=False)
        _plot(pd.concat(frames), args.out / "h200.png")
    if args.profile_out:  # the base profile + the fit on all workloads, as a profile of its own
        write_engine_profile(args.profile, report["fit_all"], source, args.profile_out, kept,
                             f"the validation run of {source.date}")


def write_engine_profile(base: str, values: dict, source: Source, out: Path, kept: dict, fitted_on: str) -> None:
    """Write the profile ``out`` (named by its stem), made from ``base`` (a name or a .json path;
    config/profile_base.py): the engine corrections ``values`` (each with ``source``) and the ``kept``
    coefficients on top of the base's."""
    notes = (get_profile(base).notes + f" Engine-calibrated ({out.stem}): plus the real engine's per-key corrections "
             f"and host overhead fitted on {fitted_on} (reports/validation/README.md); use it to predict the GraniKV "
             f"engine itself.")
    doc = derived(base, out, PROFILE_DIR, name=out.stem, notes=notes)
    doc["coefficients"] = {name: {"value": v, "unit": unit_of(name),
                                  "source": {"kind": "measured", "date": source.date, "command": source.command,
                                             "note": source.note}} for name, v in values.items()}
    doc["coefficients"].update(kept)
    doc["coefficients"]["host.overlap"] = ENGINE_HOST_OVERLAP
    doc["coefficients"]["host.duplex"] = ENGINE_HOST_DUPLEX
    out.write_text(json.dumps(doc, indent=2) + "\n")


def _load(run: Path, policy: str = "granikv", model: str = "llama-3.1-8b"):
    """A run's units of `policy` on `model` (folder names, in VALIDATION's order: the unit's own name, or in an
    older run the bare workload name for granikv on llama-3.1-8b), their steps (with the host-work columns the
    fit needs) and stored plans."""
    def unit(w):
        own = unit_name(w, policy, model)
        if (run / own / "steps.parquet").exists():
            return own
        old = (policy, model) == ("granikv", "llama-3.1-8b") and (run / w / "steps.parquet").exists()
        return w if old else None

    names = [u for u in map(unit, VALIDATION) if u is not None]
    plans = {n: load_plans(run / n / "plans.pkl") for n in names}
    steps = {n: pd.read_parquet(run / n / "steps.parquet") for n in names}
    steps = {n: s.assign(**pd.DataFrame([host_work(p, after) for after, p in after_each(plans[n])],
                                        index=s.index)) for n, s in steps.items()}
    return names, steps, plans


def kept_coefficients(profile_out: Path | None) -> dict:
    """Coefficients of an existing --profile-out that the grid fits (engine_vs_sim.py --fit) put there."""
    if profile_out is None or not profile_out.exists():
        return {}
    old = profile_json(profile_out)["coefficients"]
    return {k: v for k, v in old.items() if k in KEEP}


KEEP = ("attn.decode.shared_reread",)  # fitted on the speedup grid (engine_vs_sim.py --fit)
VARIANTS = (("at_run_time", "model at run time"), ("microbenchmark_profile", "microbenchmark profile"),
            ("engine_calibrated_held_out", "engine-calibrated, held out"),
            ("engine_calibrated_in_sample", "engine-calibrated, in sample"))


def _tables(report: dict, variants=None) -> str:
    """Markdown: per workload and model variant, the per-step total error and the end-to-end errors;
    then the per-key median step errors."""
    e2e = ("throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
    out = ["| workload | model | step error median / p90 | " + " | ".join(e2e) + " |", "|" + "---|" * (3 + len(e2e))]
    keys: list[str] = []
    variants = variants or VARIANTS
    for n, w in report["workloads"].items():
        for v, label in variants:
            label = label + (" (workload held out of every fit)" if w.get("held_out") else "")
            if w[v] is None:
                out.append(f"| {n} | {label} | none: no other workload of the run to fit on |" + " - |" * len(e2e))
                continue
            s = w[v]["step_errors"]
            keys += [k for k in s if k not in keys and k != "total"]
            out.append(f"| {n} | {label} | {s['total']['median']:.1%} / {s['total']['p90']:.1%} | "
                       + " | ".join(f"{w[v]['end_to_end'][k]['error']:.1%}" for k in e2e) + " |")
    out += ["", "| workload | model | " + " | ".join(keys) + " |", "|" + "---|" * (2 + len(keys))]
    for n, w in report["workloads"].items():
        for v, label in variants[1:]:
            if w[v] is None:
                continue
            s = w[v]["step_errors"]
            out.append(f"| {n} | {label} | " + " | ".join(f"{s[k]['median']:.1%}" if k in s else "-" for k in keys) + " |")
    idle = {n: w.get("idle") for n, w in report["workloads"].items()}
    out += ["", "Idle between arrivals (the engine waited out the gaps as a server would): "
            + ", ".join(f"{n} {'on' if v else 'off' if v is False else 'not recorded'}" for n, v in idle.items())]
    return "\n".join(out) + "\n"


def _plot(df: pd.DataFrame, path: Path) -> None:
    from granisim.experiments.plots import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for n, g in df.groupby("workload"):
        axes[0].scatter(g.measured_s * 1e3, g.predicted_s * 1e3, s=4, alpha=0.5, label=n)
        axes[1].hist(((g.predicted_s - g.measured_s) / g.measured_s).clip(-0.5, 0.5), bins=60, alpha=0.5, label=n)
    hi = float(max(df.measured_s.max(), df.predicted_s.max()) * 1e3)
    axes[0].plot([0.1, hi], [0.1, hi], "k--", lw=0.8)
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("measured step (ms)")
    axes[0].set_ylabel("predicted step (ms), engine-calibrated, held out")
    axes[1].set_xlabel("relative step error (clipped to +-50%)")
    for a in axes:
        a.legend(fontsize=8)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
