"""The `granisim` command: run, compare, demo, fuzz, bench, profile."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from granisim.scenario import Scenario, ScenarioError, load_scenario

DEMO_POLICIES = "granikv,token,paged16"


def _demo_scenario() -> tuple[Scenario, str]:
    ref = resources.files("granisim.scenarios").joinpath("demo.toml")
    with resources.as_file(ref) as p:
        return load_scenario(p), str(p)


def _run_one(scenario: Scenario, source: str, out: Path, progress: bool = True) -> dict:
    from granisim.simulate import prepare, simulate, write_outputs

    setup = prepare(scenario, source)
    result = simulate(setup, progress=progress)
    return write_outputs(setup, result, out)


def _table(rows: dict[str, dict]) -> str:
    cols = [("throughput_rps", "req/s", "{:.3f}"), ("output_tok_s", "out tok/s", "{:.0f}"),
            ("ttft_p50_s", "TTFT p50", "{:.3f}"), ("ttft_p99_s", "TTFT p99", "{:.3f}"),
            ("tpot_p50_s", "TPOT p50", "{:.4f}"), ("tpot_p99_s", "TPOT p99", "{:.4f}"),
            ("completed", "done", "{}"), ("rejected", "rej", "{}"), ("preemptions", "preempt", "{}"),
            ("mean_batch", "batch", "{:.1f}"), ("prefix_hit_rate", "hit", "{:.2f}")]
    first = next(iter(rows.values()))
    base = first["throughput_rps"] if first["throughput_rps"] else None
    head = f"{'policy':<10}" + "".join(f"{h:>11}" for _, h, _ in cols) + f"{'vs first':>10}"
    lines = [head, "-" * len(head)]
    for name, s in rows.items():
        cells = "".join(f"{fmt.format(s[k]):>11}" for k, _, fmt in cols)
        ratio = f"{s['throughput_rps'] / base:.2f}x" if base else "-"
        lines.append(f"{name:<10}{cells}{ratio:>10}")
    return "\n".join(lines)


def cmd_run(args) -> int:
    scenario = load_scenario(args.scenario)
    if args.executor == "gpu":
        print("the GPU executor is not available in this build (issue: real engine)", file=sys.stderr)
        return 2
    out = Path(args.out or f"out/{scenario.name}")
    summary = _run_one(scenario, args.scenario, out)
    print(_table({scenario.policy.name: summary}))
    print(f"\nwrote {out}/ (requests.parquet, steps.parquet, summary.json, plots, trace.json)")
    return 0


def compare(scenario: Scenario, source: str, policies: list[str], out: Path, progress: bool = True) -> dict:
    import pandas as pd

    from granisim.report import plot_compare

    summaries, reqs = {}, {}
    for pol in policies:
        sc = scenario.with_changes(**{"policy.name": pol})
        summaries[pol] = _run_one(sc, source, out / pol, progress)
        reqs[pol] = pd.read_parquet(out / pol / "requests.parquet")
    (out / "compare.json").write_text(json.dumps(summaries, indent=2, sort_keys=True))
    table = _table(summaries)
    (out / "compare.txt").write_text(table + "\n")
    plot_compare(summaries, reqs, out, title=f"{scenario.name}: {', '.join(policies)}")
    return summaries


def cmd_compare(args) -> int:
    scenario = load_scenario(args.scenario)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise ScenarioError("--policies: give at least one policy, e.g. granikv,token,paged16")
    out = Path(args.out or f"out/{scenario.name}-compare")
    summaries = compare(scenario, args.scenario, policies, out)
    print(_table(summaries))
    print(f"\nwrote {out}/")
    return 0


def cmd_demo(args) -> int:
    scenario, source = _demo_scenario()
    out = Path(args.out)
    from granisim.simulate import prepare

    setup = prepare(scenario, source)
    wl = scenario.workload
    print(f"GraniKV demo: {setup.model.name} on {setup.profile.name}, {wl.roles} agent roles x {wl.prefix_len}-token "
          f"prefixes, Azure-trace suffixes, Poisson {wl.rate} req/s, {wl.num_requests} requests")
    print(f"KV budget: {setup.kv_budget} tokens ({setup.profile.memory_bytes / 1e9:.0f} GB x "
          f"{scenario.hardware.mem_fraction} - {setup.model.weight_bytes / 1e9:.1f} GB weights - "
          f"{scenario.hardware.reserve_gb} GB reserve; {setup.model.kv_bytes_per_token} B/token); M_sat = {setup.m_sat}")
    summaries = compare(scenario, source, DEMO_POLICIES.split(","), out)
    print(_table(summaries))
    g = summaries["granikv"]["throughput_rps"]
    print("\ngranikv throughput: " + ", ".join(f"{g / s['throughput_rps']:.2f}x {name}"
                                              for name, s in summaries.items() if name != "granikv"))
    print(f"\nwrote {out}/ (per-policy folders, compare.json, compare.txt, compare.png)")
    return 0


def cmd_fuzz(args) -> int:
    import hypothesis
    from hypothesis.stateful import run_state_machine_as_test

    from granisim.fuzz import allocator_machine, default_factory, fuzz_settings

    machine = allocator_machine(default_factory(args.allocator))
    hypothesis.seed(args.seed)(machine)
    try:
        run_state_machine_as_test(machine, settings=fuzz_settings(args.examples, args.steps))
    except Exception as err:
        # hypothesis attaches the shrunk, replayable rule sequence to the error as notes
        for note in getattr(err, "__notes__", []):
            print(note, file=sys.stderr)
        print(f"\nFUZZ FAILURE ({args.allocator}): {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(f"fuzz {args.allocator}: {args.examples} examples, no invariant violated (seed {args.seed})")
    return 0


def cmd_bench(args) -> int:
    if args.what == "alloc":
        from granisim import bench_alloc

        bench_alloc.run(args.out or "reports/alloc.json")
    return 0


def cmd_profile(args) -> int:
    from granisim.hardware import get_profile

    if args.action == "show":
        print(get_profile(args.name).describe())
    else:
        p = get_profile(args.name)
        print(f"{args.name}: valid profile {p.name!r} ({len(p.coefficients)} coefficients)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="granisim", description="GraniKV serving simulator")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate one scenario")
    r.add_argument("scenario")
    r.add_argument("--out")
    r.add_argument("--executor", choices=["cost", "gpu"], default="cost")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("compare", help="same arrivals under several policies")
    c.add_argument("scenario")
    c.add_argument("--policies", default=DEMO_POLICIES)
    c.add_argument("--out")
    c.set_defaults(fn=cmd_compare)
    d = sub.add_parser("demo", help="the built-in default scenario, three policies")
    d.add_argument("--out", default="reports/demo")
    d.set_defaults(fn=cmd_demo)
    f = sub.add_parser("fuzz", help="property-based fuzzing of an allocator policy")
    f.add_argument("--allocator", choices=["granikv", "paged", "token"], default="granikv")
    f.add_argument("--examples", type=int, default=1000)
    f.add_argument("--steps", type=int, default=30, help="rules per example")
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(fn=cmd_fuzz)
    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=["alloc"])
    b.add_argument("--out")
    b.set_defaults(fn=cmd_bench)
    pr = sub.add_parser("profile", help="hardware profiles")
    pr.add_argument("action", choices=["show", "check"])
    pr.add_argument("name", help="profile name or JSON file")
    pr.set_defaults(fn=cmd_profile)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # profile files and other user input
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
