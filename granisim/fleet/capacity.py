"""Fleet capacity: the fewest replicas that hold arrival rate R within an SLO, per router × policy.

Each probe is a full fleet simulation of the scenario at ``workload.rate = R`` with ``n``
replicas (the scenario's [fleet] router parameters and staleness; faults whose replica
index is below ``n``). A probe passes as in :mod:`granisim.experiments.capacity`: every
request completes and every SLO metric is at or under its limit. The search bisects ``n``
over ``1 .. max_replicas`` assuming more replicas never hurt (true in expectation; every
probe is kept in the output). Router × policy pairs are searched in parallel (local
processes). Finished probes are kept in ``OUT/probes.jsonl`` (granisim.experiments.probes): the
same search run again over the same folder resumes where it stopped.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from granisim.config.files import out_folder
from granisim.config.scenario import Scenario, ScenarioError
from granisim.core.metrics import strict_json
from granisim.experiments.capacity import meets, replay_field
from granisim.experiments.compare import DEMO_POLICIES, parse_names, policy_scenarios
from granisim.experiments.probes import tidy


@dataclass
class FleetCapacity:
    router: str
    policy: str
    replicas: int | None  # fewest passing (None: not even max_replicas)
    gpus: int | None
    probes: list[dict] = field(default_factory=list)


def fleet_scenario(scenario: Scenario, n: int, router: str, policy: str, rate: float) -> Scenario:
    from granisim.config.scenario import parse_scenario

    data = scenario.model_dump()
    fleet = dict(data.get("fleet") or {})
    fleet.update(replicas=n, router=router, groups=(),
                 faults=[f for f in fleet.get("faults", ()) if f["replica"] < n])
    data["fleet"] = fleet
    data["policy"]["name"] = policy
    data["workload"]["rate"] = float(rate)
    return parse_scenario(data, source=f"<{n} replicas, {router}, {policy}>")


def probe(scenario: Scenario) -> dict:
    from granisim.fleet.build import simulate_fleet
    from granisim.fleet.outputs import fleet_requests, fleet_steps, fleet_summary

    res = simulate_fleet(scenario, progress=False)
    s = fleet_summary(res, fleet_requests(res), fleet_steps(res))
    s.pop("replicas")
    return s


def fewest_replicas(test, max_replicas: int) -> int | None:
    """Smallest n in 1..max_replicas with test(n) true, by bisection (test assumed monotone)."""
    if not test(max_replicas):
        return None
    lo, hi = 0, max_replicas  # test(lo) false (or lo = 0), test(hi) true
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _search(args: tuple) -> FleetCapacity:
    blob, router, policy, rate, slo, max_replicas, out = args
    from granisim.config.scenario import parse_scenario
    from granisim.experiments.probes import ProbeLog

    base = parse_scenario(json.loads(blob))
    res = FleetCapacity(router, policy, None, None)
    log = ProbeLog(out)

    def test(n: int) -> bool:
        sc = fleet_scenario(base, n, router, policy, rate)
        s, fresh = log.run(sc, lambda: probe(sc), f"{router} {policy} {n} replicas")
        ok = meets(s, slo)
        print(f"  {router} / {policy}, {n} replicas: {'holds' if ok else 'misses'} the SLO"
              + ("" if fresh else f" (kept in {log.path})"), file=sys.stderr, flush=True)
        res.probes.append({"replicas": n, "ok": ok, **{k: s.get(k) for k in slo},
                           "throughput_rps": s.get("throughput_rps"), "rejected": s.get("rejected", 0),
                           "prefix_hit_rate": s.get("prefix_hit_rate")})
        return ok

    res.replicas = fewest_replicas(test, max_replicas)
    res.gpus = res.replicas and res.replicas * base.hardware.tp  # each replica is hardware.tp GPUs
    return res


def fleet_capacity_table(results: list[FleetCapacity], slo: dict[str, float], rate: float, max_n: int) -> str:
    head = f"{'router':<14}{'policy':<10}{'replicas':>9}{'GPUs':>6}" + "".join(f"{k[:-2]:>11}" for k in slo) + \
        f"{'hit':>6}{'probes':>8}"
    lines = [f"fewest replicas holding {rate:g} req/s (searched 1..{max_n})", head, "-" * len(head)]
    for r in results:
        best = next((p for p in r.probes if p["ok"] and p["replicas"] == r.replicas), None)
        cells = "".join(f"{best[k]:>11.4f}" if best else f"{'-':>11}" for k in slo)
        hit = f"{best['prefix_hit_rate']:>6.2f}" if best else f"{'-':>6}"
        n = str(r.replicas) if r.replicas else f">{max_n}"
        lines.append(f"{r.router:<14}{r.policy:<10}{n:>9}{(r.gpus or '-')!s:>6}{cells}{hit}{len(r.probes):>8}")
    return "\n".join(lines)


def plot_fleet_capacity(results: list[FleetCapacity], slo: dict[str, float], path: Path, title: str) -> None:
    from granisim.experiments.plots import plt, save_figure

    fig, axes = plt.subplots(1, len(slo), figsize=(6 * len(slo), 4.5), squeeze=False)
    for ax, (k, limit) in zip(axes[0], slo.items()):
        for r in results:
            pts = sorted((p["replicas"], p[k]) for p in r.probes if p[k] is not None and p[k] == p[k])
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"{r.router} / {r.policy}")
        ax.axhline(limit, color="red", ls="--", lw=1, label=f"SLO {limit:g} s")
        ax.set_yscale("log")
        ax.set_xlabel("replicas")
        ax.set_ylabel(f"{k} (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)


def fleet_capacity(scenario: Scenario, routers: list[str], policies: list[str], slo: dict[str, float], rate: float,
                   max_replicas: int, out: Path, workers: int | None = None) -> list[FleetCapacity]:
    if scenario.fleet is not None and scenario.fleet.groups:
        raise ScenarioError("--rate: the fewest-replicas search needs a fleet of one kind; remove [[fleet.groups]]")
    if rate <= 0 or max_replicas < 1:
        raise ScenarioError(f"--rate {rate:g} / --max-replicas {max_replicas}: need a rate > 0 and at least 1 replica")
    blob = json.dumps(scenario.model_dump(mode="json"))
    jobs = [(blob, r, p, rate, slo, max_replicas, out) for r in routers for p in policies]
    workers = min(workers or len(jobs), len(jobs))
    if workers > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("forkserver")) as ex:
            results = list(ex.map(_search, jobs))
    else:
        results = [_search(j) for j in jobs]
    out.mkdir(parents=True, exist_ok=True)
    tidy(out)  # the searches' probes in a fixed order, however the parallel searches finished
    (out / "fleet_capacity.json").write_text(strict_json({
        "scenario": scenario.model_dump(mode="json"), "slo": slo, "rate": rate, "max_replicas": max_replicas,
        "results": [{"router": r.router, "policy": r.policy, "replicas": r.replicas, "gpus": r.gpus,
                     "probes": r.probes} for r in results]}, indent=2))
    (out / "fleet_capacity.txt").write_text(fleet_capacity_table(results, slo, rate, max_replicas) + "\n")
    plot_fleet_capacity(results, slo, out / "fleet_capacity.png",
                        f"{scenario.name}: {rate:g} req/s within SLO, by fleet size")
    return results


def fleet_capacity_cli(args) -> int:
    from granisim.config.scenario import check_effective_in_runs, read_scenario, scenario_runs
    from granisim.experiments.capacity import parse_slo
    from granisim.experiments.sensitivity import scaled_scenarios
    from granisim.fleet.compare import parse_routers

    scenario, written = read_scenario(args.scenario)  # its policy and router: checked against the runs below
    wl = scenario.workload
    if wl.kind == "azure" or wl.arrivals == "trace":  # every probe sets workload.rate, which a replay ignores
        raise ScenarioError(f"{args.scenario}: field {replay_field(wl)}: capacity --rate {args.rate:g} offers the "
                            "fleet that Poisson rate; a trace replay's arrivals have no rate to set (use "
                            "workload.arrivals = \"poisson\" with workload.kind = \"multi_agent\" or \"control\")")
    if scenario.fleet is not None and scenario.fleet.groups:
        raise ScenarioError(f"{args.scenario}: field fleet.groups ({len(scenario.fleet.groups)} groups): capacity "
                            f"--rate {args.rate:g} sizes a fleet of one kind of replica; remove [[fleet.groups]]")
    slo = parse_slo(args.slo)
    default_router = scenario.fleet.router if scenario.fleet is not None else "round_robin"
    routers = parse_routers(default_router if args.routers is None else args.routers)  # '' is refused there
    policies = parse_names("--policies", scenario.policy.name if args.policies is None else args.policies,
                           DEMO_POLICIES)
    policy_scenarios(scenario, args.scenario, policies)  # names and budgets, early: one line, before any simulation
    check_effective_in_runs(written, scenario_runs(scenario, policies=policies, routers=routers), args.scenario,
                            f" (in every run of --routers {','.join(routers)} x --policies {','.join(policies)})")
    if args.sensitivity is not None:  # its scaled scenarios checked before any probe
        scaled_scenarios(scenario, args.scenario, args.sensitivity)
    out = out_folder(args.out, f"out/{scenario.name}-fleet-capacity")
    last = max((f.replica for f in scenario.fleet.faults), default=0) if scenario.fleet is not None else 0
    if last > 0:  # said, not dropped silently
        print(f"note: {args.scenario}: a probe of n replicas keeps the faults of replicas 0 .. n-1 only "
              f"(fleet.faults name replicas up to {last})", file=sys.stderr)
    results = fleet_capacity(scenario, routers, policies, slo, args.rate, args.max_replicas, out, args.workers)
    print(fleet_capacity_table(results, slo, args.rate, args.max_replicas))
    print(f"\nwrote {out}/ (fleet_capacity.json, fleet_capacity.txt, fleet_capacity.png)")
    if args.sensitivity is not None:  # the same searches with every step slower and faster
        d, scaled = args.sensitivity, {}
        for f, sc in scaled_scenarios(scenario, args.scenario, d):
            print(f"\nevery step x {f:g}:")
            scaled[f] = fleet_capacity(sc, routers, policies, slo, args.rate, args.max_replicas,
                                       out / f"steps_x{f:g}", args.workers)
        table = fleet_sensitivity_rows(results, scaled)
        (out / "fleet_capacity_sensitivity.json").write_text(strict_json({"delta": d, "rows": table}, indent=2) + "\n")
        print("\n" + fleet_sensitivity_table(table, d, args.max_replicas)
              + f"\nwrote {out}/fleet_capacity_sensitivity.json (and steps_x*/)")
    return 0


def fleet_sensitivity_rows(base: list[FleetCapacity], scaled: dict[float, list[FleetCapacity]]) -> list[dict]:
    """Per router and policy: the fewest replicas as priced and with every step scaled by each factor (None: more
    than the search's most) (pure)."""
    return [{"router": r.router, "policy": r.policy, "replicas": r.replicas,
             "at": {f"{f:g}": res[i].replicas for f, res in sorted(scaled.items())}} for i, r in enumerate(base)]


def fleet_sensitivity_table(rows: list[dict], delta: float, max_n: int) -> str:
    def n(x) -> str:
        return str(x) if x else f">{max_n}"

    factors = list(rows[0]["at"]) if rows else []
    head = f"{'router':<14}{'policy':<10}{'replicas':>9}" + "".join(f"{'steps x' + f:>12}" for f in factors)
    lines = [f"fewest replicas, every step's time x (1 -+ {delta:g})", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['router']:<14}{r['policy']:<10}{n(r['replicas']):>9}"
                     + "".join(f"{n(x):>12}" for x in r["at"].values()))
    return "\n".join(lines)
