"""The `granisim` command: run, validate, compare, demo, sweep, capacity, paper, fuzz, bench, profile, calibrate
(the policy comparison and demo scenario live in granisim.experiments.compare)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from granisim.experiments.compare import (DEMO_POLICIES, compare, demo_scenario, own_policies, parse_names,
                                          refuse_policies, run_one, summary_table)
from granisim.config.files import OneLineParser, out_file, out_folder
from granisim.config.scenario import (MAX_REPLICAS, ScenarioError, check_effective_in_runs, load_scenario,
                                      read_scenario, scenario_runs)
from granisim.experiments.sensitivity import DEFAULT_DELTA

def gpu_executor(setup, device: str):
    """The real engine's executor (gpu_backend); a clear error where torch or a GPU is missing."""
    try:
        from gpu_backend.executor import for_setup
    except ImportError as err:
        raise ScenarioError(f"--executor gpu needs torch and triton (pip install '.[gpu]'): {err}") from None
    return for_setup(setup, device)


def fleet_gpu_executors(device: str):
    """A fleet's executors on one device: one per replica (its own KV buffers), the model weights shared."""
    try:
        from gpu_backend.executor.fleet import FleetExecutors
    except ImportError as err:
        raise ScenarioError(f"--executor gpu needs torch and triton (pip install '.[gpu]'): {err}") from None
    return FleetExecutors(device)


def cmd_run(args) -> int:
    scenario = load_scenario(args.scenario)
    out = out_folder(args.out, f"out/{scenario.name}")
    make = None
    if args.executor == "gpu":
        make = (fleet_gpu_executors(args.device) if scenario.fleet is not None
                else (lambda setup: gpu_executor(setup, args.device)))
    if args.executor == "gpu":
        _measured_steps(scenario, args.scenario, "--executor gpu")
    if args.sensitivity is not None and args.executor == "gpu":
        raise ScenarioError(f"--sensitivity {args.sensitivity}: scales the cost model's step times; "
                            f"--executor gpu measures them")
    if args.sensitivity is not None:  # its scaled scenarios checked before the base run
        from granisim.experiments.sensitivity import scaled_scenarios

        scaled_scenarios(scenario, args.scenario, args.sensitivity)
    summary = run_one(scenario, args.scenario, out, make_executor=make)
    if scenario.fleet is not None:
        from granisim.fleet.outputs import fleet_table

        print(fleet_table(summary))
    else:
        print(summary_table({scenario.policy.name: summary}))
    print(f"\nwrote {out}/ (requests.parquet, steps.parquet, summary.json, plots, trace.json)")
    if args.sensitivity is not None:
        from granisim.experiments import sensitivity as sens

        import pandas as pd

        replicas = sens.replica_of(pd.read_parquet(out / "requests.parquet"))
        if replicas:
            summary = {**summary, "same_replica_share": 1.0}
        table = sens.rows(summary, sens.scaled_summaries(scenario, args.scenario, args.sensitivity, replicas))
        sens.write(out, table, args.sensitivity)
        print("\n" + sens.format_table(table, args.sensitivity) + f"\nwrote {out}/sensitivity.json")
    return 0


def _measured_steps(scenario, source: str, what: str) -> None:
    """A scenario about to run on the real engine must not ask for scaled step times (a cost-model what-if)."""
    scale = scenario.hardware.step_time_scale
    if scale != 1.0:
        raise ScenarioError(f"{source}: field hardware.step_time_scale = {scale}: a what-if on predicted step "
                            f"times; {what} measures them (drop it)")


def cmd_validate(args) -> int:
    from granisim.experiments.run import prepare
    from granisim.validation.validate import validate

    scenario = load_scenario(args.scenario)
    _measured_steps(scenario, args.scenario, "validate")
    out_folder(args.out)  # a file there: refused before the GPU is set up
    if scenario.fleet is not None:  # every replica's steps on the one device, taking turns
        from granisim.validation.validate import validate_fleet

        report = validate_fleet(scenario, args.scenario, fleet_gpu_executors(args.device), Path(args.out))
        print((Path(args.out) / "validation.md").read_text())
        return 0 if report["steps"] else 1
    setup = prepare(scenario, args.scenario)
    if scenario.hardware.tp > 1:  # the replica's ranks, one process each (gpu_backend/executor/tp.py)
        try:
            from gpu_backend.executor.tp import validate_replica
        except ImportError as err:
            raise ScenarioError(f"validate needs torch and triton (pip install '.[gpu]'): {err}") from None
        validate_replica(setup, args.out, args.device, args.scenario)
        print((Path(args.out) / "validation.md").read_text())
        return 0
    report = validate(setup, gpu_executor(setup, args.device), Path(args.out))
    print((Path(args.out) / "validation.md").read_text())
    return 0 if report["steps"] else 1


def cmd_compare(args) -> int:
    scenario, written = read_scenario(args.scenario)  # its policy and router are checked against the runs below
    if args.routers is not None and args.policies is not None:  # each router runs the scenario's one policy
        raise ScenarioError(f"--policies {args.policies}: compare --routers runs the scenario's policy "
                            f"({scenario.policy.name}) behind each router; set policy.name in the scenario instead")
    if args.routers is not None:  # the fleet behind each router ('' too: refused by parse_routers)
        from granisim.fleet.compare import compare_routers, parse_routers
        from granisim.fleet.outputs import routers_table

        routers = parse_routers(args.routers)
        if scenario.fleet is None or scenario.fleet.size < 2:  # one replica: every router sends it everything
            raise ScenarioError(f"--routers {args.routers}: {args.scenario} is one replica "
                                f"({'no [fleet] section' if scenario.fleet is None else 'fleet.replicas = 1'}), "
                                f"so every router gives the same run; set [fleet] replicas >= 2")
        check_effective_in_runs(written, scenario_runs(scenario, routers=routers), args.scenario,
                                f" (in every run of --routers {','.join(routers)})")
        out = out_folder(args.out, f"out/{scenario.name}-routers")
        print(routers_table(compare_routers(scenario, args.scenario, routers, out)))
        print(f"\nwrote {out}/")
        return 0
    if args.policies is not None and own_policies(scenario):
        refuse_policies(scenario, args.scenario, args.policies)
    policies = parse_names("--policies", DEMO_POLICIES if args.policies is None else args.policies, DEMO_POLICIES)
    label = "--policies" if args.policies is not None else "compare's default --policies"
    check_effective_in_runs(written, scenario_runs(scenario, policies=policies), args.scenario,
                            f" (in every run of {label} {','.join(policies)})")
    out = out_folder(args.out, f"out/{scenario.name}-compare")
    summaries = compare(scenario, args.scenario, policies, out)
    print(summary_table(summaries))
    print(f"\nwrote {out}/")
    return 0


def cmd_demo(args) -> int:
    scenario, source = demo_scenario()
    out = out_folder(args.out, "reports/demo")
    from granisim.experiments.run import prepare

    setup = prepare(scenario, source)
    wl = scenario.workload
    print(f"GraniKV demo: {setup.model.name} on {setup.profile.name}, {wl.roles} agent roles x {wl.prefix_len}-token "
          f"prefixes, Azure-trace suffixes, Poisson {wl.rate} req/s, {wl.num_requests} requests")
    print(f"KV budget: {setup.kv_budget} tokens ({setup.profile.memory_bytes / 1e9:.0f} GB x "
          f"{scenario.hardware.mem_fraction} - {setup.model.weight_bytes / 1e9:.1f} GB weights - "
          f"{scenario.hardware.reserve_gb} GB reserve; {setup.model.kv_bytes_per_token} B/token); M_sat = {setup.m_sat}")
    summaries = compare(scenario, source, DEMO_POLICIES.split(","), out)
    print(summary_table(summaries))
    g = summaries["granikv"]["throughput_rps"]
    print("\ngranikv throughput: " + ", ".join(f"{g / s['throughput_rps']:.2f}x {name}"
                                              for name, s in summaries.items() if name != "granikv"))
    print(f"\nwrote {out}/ (per-policy folders, compare.json, compare.txt, compare.png)")
    return 0


def cmd_sweep(args) -> int:
    from granisim.experiments.sweep import failure_lines, run_sweep
    from granisim.experiments.sweep_file import load_sweep
    from granisim.experiments.sweep_plots import write_plots

    spec = load_sweep(args.sweep)
    out = out_folder(args.out, f"out/sweep-{spec.name}")
    if args.ray is not None and args.workers is not None and args.ray != "local":
        print("note: --workers is ignored with a Ray cluster address (Ray places the tasks)", file=sys.stderr)
    df = run_sweep(spec, out, workers=args.workers, ray_address=args.ray, max_points=args.max_points)
    if len(df) < len(spec.points):
        lines = failure_lines(out, len(df), len(spec.points))
        if lines:
            print("\n".join(lines), file=sys.stderr)
            return 1
        print(f"{len(df)} of {len(spec.points)} points done; re-run the same command to continue")
        return 0
    df.drop(columns=["scenario"]).to_csv(out / "results.csv", index=False)
    paths = write_plots(spec, df, out)
    cols = [c for c in spec.varied if c in df.columns] + ["throughput_rps", "ttft_p99_s", "tpot_p99_s"]
    with __import__("pandas").option_context("display.width", 200, "display.max_rows", 40):
        print(df[cols].to_string(index=False, max_rows=40))
    print(f"\nwrote {out}/ (results/ parquet parts, results.csv, " + ", ".join(p.name for p in paths) + ")")
    return 0


def _given(args, *options: str) -> list[str]:
    """``"--option value"`` for each of ``options`` given on the command line (its argparse default is None)."""
    values = [(opt, getattr(args, opt[2:].replace("-", "_"))) for opt in options]
    return [f"{opt} {v}" for opt, v in values if v is not None]


def cmd_capacity(args) -> int:
    fleet_only = _given(args, "--routers", "--max-replicas")
    if args.rate is None and fleet_only:  # the rate search runs the scenario's own fleet as it is
        raise ScenarioError(f"{fleet_only[0]}: for the fewest-replicas search, which needs --rate R; the rate search "
                            f"simulates the scenario's fleet (set fleet.router / fleet.replicas there)")
    rate_only = _given(args, "--lo", "--hi", "--rel-tol", "--max-probes")
    if args.rate is not None and rate_only:  # the fewest-replicas search counts replicas, it probes no rates
        raise ScenarioError(f"{rate_only[0]}: for the rate search; with --rate R the search counts replicas "
                            f"(up to --max-replicas)")
    args.rel_tol = REL_TOL if args.rel_tol is None else args.rel_tol
    args.max_probes = MAX_PROBES if args.max_probes is None else args.max_probes
    if args.rate is not None:  # the fewest replicas that hold this rate (granisim.fleet.capacity)
        from granisim.fleet.capacity import fleet_capacity_cli

        if args.max_replicas is None:
            args.max_replicas = DEFAULT_MAX_REPLICAS

        return fleet_capacity_cli(args)
    from granisim.experiments.capacity import capacity_cli

    return capacity_cli(args)


def cmd_paper(args) -> int:
    from granisim.experiments.paper import paper_cli

    return paper_cli(args)


def cmd_fuzz(args) -> int:
    from granisim.experiments.fuzz_cli import run_fuzz

    return run_fuzz(args)


BENCH_REPEATS = {"alloc": 15, "sim": 3}  # bench --repeats unless given (sweep runs its points once)
BENCH_OPTIONS = {"sweep": ("points", "requests", "workers", "ray"), "sim": ("fleet", "router")}  # each bench's own


def cmd_bench(args) -> int:
    from granisim.experiments import bench_alloc, bench_sim, bench_sweep

    out = args.out or {"alloc": bench_alloc, "sweep": bench_sweep, "sim": bench_sim}[args.what].DEFAULT_OUT
    out_file(out, what="the JSON file to write")  # before the benchmark runs, not when its report is written
    if args.repeats is not None and args.what not in BENCH_REPEATS:
        raise ScenarioError(f"--repeats {args.repeats}: for bench {' and '.join(BENCH_REPEATS)}; bench {args.what} "
                            f"runs each point once")
    for what, options in BENCH_OPTIONS.items():  # an option of another benchmark would be ignored
        given = [o for o in options if getattr(args, o) not in (None, False)]
        if what != args.what and given:
            value = getattr(args, given[0])
            raise ScenarioError(f"--{given[0]}{'' if value is True else f' {value}'}: for bench {what}; bench "
                                f"{args.what} has no use for it")
    repeats = BENCH_REPEATS.get(args.what) if args.repeats is None else args.repeats
    if args.what == "alloc":
        bench_alloc.run(out, repeats=repeats)
    elif args.what == "sweep":
        given = {k: getattr(args, k) for k in ("points", "requests") if getattr(args, k) is not None}
        bench_sweep.run(out, workers=args.workers, ray=args.ray, **given)  # its own defaults otherwise
    elif args.what == "sim":
        router = args.router or "round_robin"
        if router not in bench_sim.FLEET_ROUTERS:
            raise ScenarioError(f"--router: unknown router {router!r} (known: {', '.join(bench_sim.FLEET_ROUTERS)})")
        bench_sim.run(out, bench_sim.FLEET_CASES if args.fleet else bench_sim.DEFAULT_CASES, repeats=repeats,
                      router=router)
    return 0


def cmd_profile(args) -> int:
    from granisim.config.hardware import get_profile

    if (args.name is None) != (args.action == "list"):
        raise ScenarioError(f"profile {args.action}: " + ("takes no profile name" if args.action == "list"
                                                          else "give a profile name or JSON file"))
    writes = args.action in ("derive", "carry")
    if (args.out is not None) != writes:
        raise ScenarioError(f"profile {args.action}: --out FILE.json goes with derive and carry, and they need it")
    if (args.onto is not None) != (args.action == "carry"):
        raise ScenarioError("profile carry ENGINE --onto BASE --out FILE.json: --onto goes with carry, and it needs it")
    if args.action == "list":
        from granisim.config.hardware import profiles_table

        print(profiles_table())
    elif args.action == "show":
        print(get_profile(args.name).describe())
    elif args.action == "derive":
        _derive_profile(args.name, Path(args.out))
    elif args.action == "carry":
        _carry_profile(args.name, args.onto, Path(args.out))
    else:
        p = get_profile(args.name)
        print(f"{args.name}: valid profile {p.name!r} ({len(p.coefficients)} coefficients)")
    return 0


def _new_profile_file(out: Path) -> None:
    if out.suffix != ".json":
        raise ScenarioError(f"--out {out}: a profile is a .json file")
    if out.exists():
        raise ScenarioError(f"--out {out}: already exists; give a new file")
    out_file(out)


def _derive_profile(base: str, out: Path) -> None:
    """Write a profile made from ``base`` that changes nothing yet (config/profile_base.py)."""
    import json

    from granisim.config.hardware import PROFILE_DIR, get_profile
    from granisim.config.profile_base import derived

    _new_profile_file(out)
    get_profile(base)  # a bad base: one line naming it
    doc = derived(base, out, PROFILE_DIR, name=out.stem, notes=f"{base} with the coefficients below changed")
    out.parent.mkdir(parents=True, exist_ok=True)  # as calibrate fit does for the profile it writes
    out.write_text(json.dumps({**doc, "coefficients": {}}, indent=2) + "\n")
    get_profile(str(out))
    print(f"wrote {out}: made from {base}; add coefficients to change (each with its source), then "
          f"`granisim profile show {out}`")


def _carry_profile(engine: str, onto: str, out: Path) -> None:
    """Write ``engine``'s own coefficients on base ``onto`` (granisim/calibration/carry.py)."""
    import json

    from granisim.calibration.carry import REREAD, carry
    from granisim.config.hardware import PROFILE_DIR, get_profile, has_engine_corrections
    from granisim.config.profile_base import base_file, derived

    _new_profile_file(out)
    p, new = get_profile(engine), get_profile(onto)  # a bad name or file: one line naming it
    if p.base is None:
        raise ScenarioError(f"{engine}: field base: value None: not made from a microbenchmark profile, nothing to "
                            "carry (an engine profile names its base, as h200-engine does)")
    own = json.loads(p.path.read_text())
    extra = sorted(set(own) - {"schema", "name", "gpu", "notes", "base", "coefficients"})
    if extra:
        raise ScenarioError(f"{engine}: field {extra[0]}: value present: priced against {p.base}'s own figures; "
                            "carry a profile of coefficients alone")
    if new.step_classes or has_engine_corrections(new):  # corrections on corrections
        raise ScenarioError(f"--onto {onto}: holds the real engine's corrections already (an engine profile); carry "
                            f"onto the measured profile of the GPU (as h100-sxm is for h100-engine)")
    old = get_profile(base_file(p.base, p.path.parent, PROFILE_DIR))
    coefs = carry(own.get("coefficients", {}), p.name, old, new)
    notes = (f"{p.name}'s engine corrections (fitted on {old.name}, {old.gpu}) carried onto {new.name} "
             f"(granisim profile carry; granisim/calibration/carry.py): an extrapolation until the engine is run "
             f"and refit on this GPU (granisim validation refit)")
    doc = derived(onto, out, PROFILE_DIR, name=out.stem, notes=notes)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**doc, "coefficients": coefs}, indent=2) + "\n")
    get_profile(str(out))
    print(f"wrote {out}: {len(coefs)} coefficients of {p.name} on {new.name}; {REREAD} {p[REREAD]:g} -> "
          f"{get_profile(str(out))[REREAD]:.3g}")


def cmd_calibrate_table(args) -> int:
    from granisim.calibration.more_table import add_table

    csv, report = add_table(Path(args.raw_dir), Path(args.profile), args.table_dir and Path(args.table_dir))
    print(f"wrote {csv} and its entry in {args.profile}; relative errors against the measured rows:")
    for what, e in report.items():
        if e is not None:
            print(f"  {what}: median {e['median']:.1%}, p90 {e['p90']:.1%} ({e['n']} rows)")
    return 0


def cmd_calibrate_reread(args) -> int:
    from granisim.calibration.reread import NAME, add_to_file

    entry = add_to_file(Path(args.raw_dir), Path(args.profile))
    print(f"wrote {NAME} = {entry['value']:g} into {args.profile} ({entry['source']['note'].split(' (')[0]})")
    return 0


def cmd_calibrate_skew(args) -> int:
    from granisim.calibration.skew import NAME, add_to_file

    entry = add_to_file(Path(args.run_json), Path(args.profile), args.date, args.commit, args.versions)
    print(f"wrote {NAME} = {entry['value']:g} into {args.profile} ({entry['source']['note'].split('; ', 1)[1]})")
    return 0


def cmd_calibrate_check(args) -> int:
    from granisim.calibration.check import error_table, format_table, overall, priced_rows

    out = args.out and out_file(args.out, what="the CSV file to write")  # before the pricing, not after it
    rows = priced_rows(Path(args.raw_dir), args.profile, args.family)
    print(f"{args.raw_dir} priced by {args.profile}: error = (predicted - measured) / measured")
    print(format_table(error_table(rows)))
    o = overall(rows)
    print(f"all {o['rows']} rows: median |error| {o['median_abs']:.1%}, p90 {o['p90_abs']:.1%}, "
          f"median signed {o['median_signed']:+.1%}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        rows.to_csv(out, index=False)
        print(f"wrote every row with its prediction to {out}")
    return 0


def cmd_calibrate(args) -> int:
    from granisim.calibration.run import calibrate, format_errors, write_figures

    out = out_file(args.out, what="the profile JSON file to write")  # before the fit, not after it
    if args.report:
        out_folder(args.report, option="--report")
    cal = calibrate(args.raw_dir, out, name=args.name or out.stem, start_profile=args.start, folds=args.folds,
                    progress=True, workers=args.workers)
    print(format_errors(cal.result))
    ms = cal.msat
    print(f"\nM_sat (dense beats cascade from M_eff =): {ms['overall']} overall; per L_p measured "
          f"{ {k: v['best'] for k, v in ms['per_L_measured'].items()} } (best threshold per L_p), profile crossover "
          f"{ms['per_L_model']}")
    if args.report:
        figs = write_figures(cal, args.report, cal.doc["name"])
        print("figures: " + ", ".join(str(f) for f in figs.values()))
    print(f"\nwrote {cal.profile_path} (+ {cal.doc['linear_table']['file']}, {cal.doc['kernel_table']['file']}); "
          f"use it with [hardware] profile = \"{cal.profile_path}\"")
    return 0


# `granisim validation VERB ...`: the reports built from real-engine runs (granisim.validation.<module>.main)
VALIDATION_VERBS = {
    "gpu-run": ("gpu_runs", "on a GPU: the validation workloads and the speedup grid on the real engine"),
    "report": ("report", "predicted vs measured per workload from a real-engine run folder"),
    "targets": ("targets", "the validation targets of several runs as a table"),
    "runs": ("runs", "run-to-run spread of the measured figures beside one prediction"),
    "replay": ("replay", "TPOT on the measured schedule (the cost model's error alone)"),
    "loro": ("loro", "leave one run out: each run judged by a fit on all the others"),
    "speedups": ("speedups", "speedup table from a real-engine grid run"),
    "engine-vs-sim": ("engine_vs_sim", "the simulator against the real engine's speedup grid"),
    "summary": ("summary", "one record per workload, policy, model, machine and metric (summary.json)"),
    "clock-term": ("clock_term", "per-step errors by step size with and without a power/clock heat term"),
    "step-parts": ("step_parts", "predicted / measured time by step class and part: which steps a profile misprices"),
    "fleet-summary": ("fleet_summary", "the one-GPU fleet validation: fleet-wide and per-replica errors per run"),
    "rebuild-plans": ("plans", "a run's plans.pkl rebuilt from its steps.parquet (the measured schedule replayed)"),
    "idle-effect": ("idle_effect", "the same unit measured with and without waiting out the arrival gaps"),
    "rescore": ("rescore", "a granisim validate run judged again with the current cost model and a profile"),
    "refit": ("refit", "engine corrections fitted on several machines' runs, every policy pooled (a profile)"),
    "step-classes": ("step_classes", "step-class factors (engine time over price per class of step) fitted on runs"),
    "judge": ("judge", "a candidate profile judged on every unit of several runs, beside another summary"),
    "host-probe": ("host_probe", "the host's speed: CPU time a plan of the simulator's loop on a fixed workload"),
    "paper-setting": ("paper_setting", "the paper's setting on the real engine against the simulator's prediction"),
    "sensitivity": ("sensitivity", "how far each validation workload's predictions move with every step -+ 3%"),
}


def cmd_validation(args) -> int:
    import importlib

    module = importlib.import_module(f"granisim.validation.{VALIDATION_VERBS[args.verb][0]}")
    return module.main(args.rest) or 0


def _number(kind, lo: float, lo_open: bool, hi: float | None = None):
    """An argparse type: a finite ``kind`` > lo (>= lo unless lo_open) and < hi."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}")
        finite = not (v != v or v in (float("inf"), float("-inf")))
        if not finite or v < lo or (lo_open and v == lo) or (hi is not None and v >= hi):
            bound = f"{'>' if lo_open else '>='} {lo:g}" + (f" and < {hi:g}" if hi is not None else "")
            raise argparse.ArgumentTypeError(f"{text} must be {'' if finite else 'a finite number '}{bound}")
        return v
    return parse


POS_INT, POS_FLOAT, FRACTION = _number(int, 1, False), _number(float, 0, True), _number(float, 0, True, 1)
DEFAULT_MAX_REPLICAS = 16  # capacity --rate: the largest fleet tried unless --max-replicas says
REL_TOL, MAX_PROBES = 0.02, 24  # capacity's rate search: stop at this relative bracket, or after this many probes
MAX_FOLDS = 20  # calibrate fit --folds: each fold refits every family, so more only multiplies the time


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="granisim", description="GraniKV serving simulator")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    r = sub.add_parser("run", help="simulate one scenario")
    r.add_argument("scenario")
    r.add_argument("--out")
    r.add_argument("--executor", choices=["cost", "gpu"], default="cost",
                   help="cost: predicted step times (simulator); gpu: measured on the real engine")
    r.add_argument("--device", default="cuda", help="device of the GPU executor (cuda, or cpu for tiny models)")
    r.add_argument("--sensitivity", nargs="?", const=DEFAULT_DELTA, type=_number(float, 0, True, 0.5), metavar="DELTA",
                   help="also simulate with every step DELTA slower and faster (default 0.03): how far each metric "
                        "moves (sensitivity.json)")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("validate", help="predicted vs measured: the scenario on the real engine and the simulator")
    v.add_argument("scenario")
    v.add_argument("--out", default="reports/validation/run")
    v.add_argument("--device", default="cuda")
    v.set_defaults(fn=cmd_validate)
    va = sub.add_parser("validation", help="reports from real-engine runs (granisim validation VERB --help)",
                        description="\n".join(f"{k}: {v[1]}" for k, v in VALIDATION_VERBS.items()),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    va.add_argument("verb", choices=list(VALIDATION_VERBS))
    va.add_argument("rest", nargs=argparse.REMAINDER, help="the verb's own arguments")
    va.set_defaults(fn=cmd_validation)
    c = sub.add_parser("compare", help="same arrivals under several policies")
    c.add_argument("scenario")
    c.add_argument("--policies", help=f"policies to compare (default {DEMO_POLICIES}); not with --routers")
    c.add_argument("--routers", help="compare fleet routers instead, e.g. round_robin,cache_aware,hot_aware")
    c.add_argument("--out")
    c.set_defaults(fn=cmd_compare)
    d = sub.add_parser("demo", help="the built-in default scenario, three policies")
    d.add_argument("--out", default="reports/demo")
    d.set_defaults(fn=cmd_demo)
    sw = sub.add_parser("sweep", help="a grid of scenarios, in parallel, resumable (results table + plots)")
    sw.add_argument("sweep", help="sweep file (TOML): base scenario + grid")
    sw.add_argument("--out", help="output folder (default out/sweep-NAME)")
    sw.add_argument("--workers", type=POS_INT, help="local processes (default: CPU count)")
    sw.add_argument("--ray", metavar="ADDRESS", help="run on Ray: a cluster address, or 'local' to start one")
    sw.add_argument("--max-points", type=POS_INT, help="run at most this many new points, then stop")
    sw.set_defaults(fn=cmd_sweep)
    ca = sub.add_parser("capacity", help="highest arrival rate each policy sustains within an SLO (bisection)")
    ca.add_argument("scenario")
    ca.add_argument("--slo", required=True, help="e.g. ttft_p99=2s,tpot_p99=100ms")
    ca.add_argument("--policies", help=f"policies to search (default {DEMO_POLICIES}; with --rate, the scenario's)")
    ca.add_argument("--out")
    ca.add_argument("--lo", type=POS_FLOAT, help="lowest rate to try (req/s; default: scenario rate / 8)")
    ca.add_argument("--hi", type=POS_FLOAT, help="first upper rate to try (req/s; default: scenario rate x 2)")
    ca.add_argument("--rel-tol", type=FRACTION, help=f"stop when (hi - lo) / hi is below this (default {REL_TOL})")
    ca.add_argument("--max-probes", type=POS_INT, help=f"simulations per policy at most (default {MAX_PROBES})")
    ca.add_argument("--workers", type=POS_INT, help="policies searched in parallel (local processes)")
    ca.add_argument("--rate", type=POS_FLOAT, help="fleet: the fewest replicas that hold this rate (req/s) instead")
    ca.add_argument("--max-replicas", type=_number(int, 1, False, MAX_REPLICAS + 1),
                    help=f"fleet: largest fleet to try (with --rate; default {DEFAULT_MAX_REPLICAS})")
    ca.add_argument("--routers", help="fleet: routers to search (with --rate; default: the scenario's)")
    ca.add_argument("--sensitivity", nargs="?", const=DEFAULT_DELTA, type=_number(float, 0, True, 0.5), metavar="DELTA",
                    help="also search with every step DELTA slower and faster (default 0.03): how far each answer "
                         "moves (capacity_sensitivity.json; with --rate, the fewest replicas: "
                         "fleet_capacity_sensitivity.json)")
    ca.set_defaults(fn=cmd_capacity)
    pa = sub.add_parser("paper", help="the paper's claims in simulation: reports/paper/")
    pa.add_argument("--out", default="reports/paper")
    pa.add_argument("--profiles", default="a100-80gb,h200")
    pa.add_argument("--workers", type=POS_INT)
    pa.add_argument("--ray", metavar="ADDRESS")
    pa.add_argument("--num-requests", type=POS_INT, default=400, help="requests per simulated point")
    pa.set_defaults(fn=cmd_paper)
    f = sub.add_parser("fuzz", help="property-based fuzzing of an allocator policy")
    f.add_argument("--allocator", choices=["granikv", "granikv-adaptive", "paged", "token"], default="granikv")
    f.add_argument("--examples", type=POS_INT, default=1000, help="examples (rule sequences) to try")
    f.add_argument("--max-steps", "--steps", dest="max_steps", type=POS_INT, default=30, help="rules per example")
    f.add_argument("--seed", type=_number(int, 0, False), default=0,
                   help="hypothesis' seed, >= 0 (its random.Random ignores the sign: -1 would repeat 1)")
    f.add_argument("--repro", help="reproduction test file to write on failure (default out/fuzz/repro_POLICY.py)")
    f.add_argument("--no-model", action="store_true", help="check invariants only, not the reference model")
    f.add_argument("--host-tier", action="store_true",
                   help="with a host KV tier (evicted KV kept in a small host pool), and the tier's invariants")
    f.set_defaults(fn=cmd_fuzz)
    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=["alloc", "sweep", "sim"])
    b.add_argument("--out", metavar="FILE.json",
                   help="JSON report to write (default out/bench/alloc.json, out/bench/sweep_speed.json, "
                        "out/bench/sim_speed.json; the tracked reports/ copies are refreshed with --out "
                        "reports/sim_speed/NAME.json)")
    b.add_argument("--repeats", type=POS_INT,
                   help=f"alloc, sim: runs per measurement, the median reported (default {BENCH_REPEATS['alloc']} for "
                        f"alloc, {BENCH_REPEATS['sim']} for sim)")
    b.add_argument("--points", type=POS_INT, help="sweep: points (default 1000)")
    b.add_argument("--requests", type=POS_INT, help="sweep: requests per point (default 200)")
    b.add_argument("--workers", type=POS_INT, help="sweep: local processes (default: CPU count)")
    b.add_argument("--ray", metavar="ADDRESS", help="sweep: run on Ray instead")
    b.add_argument("--fleet", action="store_true", help="sim: the fleet scaling series alone (1, 4, 16, 64 replicas)")
    b.add_argument("--router", help="sim: the fleet cases' router (round_robin, the default, or cache_aware)")
    b.set_defaults(fn=cmd_bench)
    pr = sub.add_parser("profile", help="hardware profiles")
    pr.add_argument("action", choices=["list", "show", "check", "derive", "carry"],
                    help="list: the shipped profiles, a line each; derive: write a profile made from NAME "
                         "(--out FILE.json) that holds only what you change; carry: write engine profile NAME's "
                         "corrections on another GPU's profile (--onto)")
    pr.add_argument("name", nargs="?", help="profile name or JSON file (every action but list)")
    pr.add_argument("--out", help="derive, carry: the profile file to write")
    pr.add_argument("--onto", help="carry: the microbenchmark profile of the GPU to carry to (e.g. h100-sxm)")
    pr.set_defaults(fn=cmd_profile)
    cal = sub.add_parser("calibrate", help="fit a hardware profile from GPU measurements")
    cal_sub = cal.add_subparsers(dest="calibrate_cmd", required=True, metavar="VERB")
    cf = cal_sub.add_parser("fit", help="fit RAW_DIR (python -m calibration.measure --out RAW_DIR) into a profile")
    cf.add_argument("raw_dir")
    cf.add_argument("--out", required=True, help="profile JSON to write (its tables are written beside it)")
    cf.add_argument("--name", help="profile name (default: the file name)")
    cf.add_argument("--start", default="h200", help="profile whose values start the fit (default h200)")
    cf.add_argument("--report", help="also write the M_sat and residual plots and a fit summary here")
    cf.add_argument("--folds", type=_number(int, 1, False, MAX_FOLDS + 1), default=5,
                    help=f"cross-validation folds for the held-out errors, 1-{MAX_FOLDS} (each a whole fit; "
                         "1: one seeded 20%% hold-out)")
    cf.add_argument("--workers", type=POS_INT, help="local processes (default: CPU count, at most 5); same result")
    cf.set_defaults(fn=cmd_calibrate)
    ct = cal_sub.add_parser("table", help="add a linear table measured at another model's shapes to a profile")
    ct.add_argument("raw_dir", help="python -m calibration.measure --model MODEL --only linear --out RAW_DIR")
    ct.add_argument("--profile", required=True, help="profile JSON to extend (more_linear_tables)")
    ct.add_argument("--table-dir", help="where the CSV goes (default: beside the profile; or granisim/config/data)")
    ct.set_defaults(fn=cmd_calibrate_table)
    cr = cal_sub.add_parser("reread", help="add the decode kernel's measured re-read share of a shared prefix to a "
                            "profile (what `granisim profile carry` reads)")
    cr.add_argument("raw_dir", help="python -m calibration.measure --only shared_decode --out RAW_DIR")
    cr.add_argument("--profile", required=True, help="profile JSON to write it into")
    cr.set_defaults(fn=cmd_calibrate_reread)
    cs = cal_sub.add_parser("skew", help="add how much slower a skewed, split decode batch streams its KV (the "
                            "split-balance benchmark) to a profile")
    cs.add_argument("run_json", help="python3 -m gpu_backend.bench.split_balance --out DIR (DIR/split_balance.json)")
    cs.add_argument("--profile", required=True, help="profile JSON to write it into")
    cs.add_argument("--date", help="when the benchmark ran (recorded in the source; else the JSON's own)")
    cs.add_argument("--commit", help="the code it ran (recorded in the source; else the JSON's own)")
    cs.add_argument("--versions", help="torch / triton versions it ran (recorded in the source; else the JSON's own)")
    cs.set_defaults(fn=cmd_calibrate_skew)
    cc = cal_sub.add_parser("check", help="price RAW_DIR's attention rows with a profile: errors by family, storage, G")
    cc.add_argument("raw_dir", help="python -m calibration.measure --out RAW_DIR (attention.csv, extend_shapes.csv, "
                    "extend_ragged.csv)")
    cc.add_argument("--profile", default="h200", help="profile name or JSON file (default h200)")
    cc.add_argument("--family", help="only this family (decode, cascade, dense, extend, merge, kv_write, kv_copy)")
    cc.add_argument("--out", help="also write every row with its prediction (CSV)")
    cc.set_defaults(fn=cmd_calibrate_check)
    return p


RESUMABLE = ("sweep", "paper")  # commands that keep every finished point and skip it on a re-run


def _stopped_line(err, argv: list[str]) -> str:
    import shlex

    again = "granisim " + shlex.join(argv)
    if argv and argv[0] in RESUMABLE:
        return f"stopped by {err}: finished points are kept; resume with the same command: {again}"
    return f"stopped by {err}: run the same command to start again: {again}"


def _option_of(args, filename) -> str:
    """``"--out DIR: "`` where ``filename`` is (under) the path an output option of ``args`` gave, else ``""``."""
    if filename is None:
        return ""
    for option in ("out", "repro", "report", "table", "fleet_out"):
        given = getattr(args, option, None)
        if given is None or not str(given):
            continue
        a, b = str(filename).rstrip("/") + "/", str(given).rstrip("/") + "/"
        if a.startswith(b) or b.startswith(a):  # the path, or a folder above it that could not be made
            return f"--{option.replace('_', '-')} {given}: cannot write "
    return ""


def main(argv: list[str] | None = None) -> int:
    from granisim.experiments import stopping

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    previous = {s: signal.getsignal(s) for s in stopping.SIGNALS}
    stopping.install()  # SIGINT / SIGTERM: workers stopped, one line, exit 130 / 143
    try:
        return args.fn(args)
    except ValueError as err:  # ScenarioError, ProfileError and other user input: one line, exit 2
        print(f"error: {' '.join(str(err).splitlines())}", file=sys.stderr)
        return 2
    except OSError as err:  # an --out that is a file, an unwritable folder, ...: one line naming the path, exit 2
        print(f"error: {_option_of(args, err.filename)}{err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return 2
    except stopping.Stopped as err:
        print(_stopped_line(err, argv), file=sys.stderr, flush=True)
        return err.exit_code
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
