"""SLO capacity search: the highest Poisson arrival rate a policy sustains within an SLO.

Each probe is a full simulation of the scenario at ``workload.rate = λ``. A probe passes
when every request completes (none rejected) and every SLO metric is at or under its
limit. The search brackets the answer — ``lo`` passes, ``hi`` fails, doubling ``hi`` /
halving ``lo`` until they do — then bisects until ``(hi - lo) / hi <= rel_tol``. It
assumes the p99s grow with the rate (true in expectation; a seeded run can wobble near
the answer, so every probe is kept in the output for inspection). Finished probes are kept in
``OUT/probes.jsonl`` (granisim.experiments.probes): the same search run again over the same
folder resumes where it stopped.

SLO syntax: ``ttft_p99=2s,tpot_p99=100ms`` — metric names are the summary's latency
percentiles without ``_s`` (``ttft_p50``, ``ttft_p99``, ``tpot_p50``, ``tpot_p99``,
``e2e_p50``, ``e2e_p99``, ``queue_p50``); units ``s``, ``ms``, ``us`` (``µs``), ``min``;
a bare number is seconds.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from granisim.config.files import out_folder
from granisim.config.scenario import Scenario, ScenarioError
from granisim.core.metrics import strict_json
from granisim.experiments.probes import tidy

SLO_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "queue_p50")
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60.0, "": 1.0}
_ITEM = re.compile(r"^\s*([a-z0-9_]+)\s*(?:=|<=|<)\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*([a-zµ]*)\s*$", re.I)


def parse_slo(text: str) -> dict[str, float]:
    """``"ttft_p99=2s,tpot_p99=100ms"`` -> ``{"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}``."""
    out = {}
    for item in [x for x in text.split(",") if x.strip()]:
        m = _ITEM.match(item)
        if not m:
            raise ScenarioError(f"--slo: cannot read {item.strip()!r}; write e.g. ttft_p99=2s,tpot_p99=100ms")
        name, value, unit = m.group(1).lower(), float(m.group(2)), m.group(3)
        if not unit and not name.endswith("_s"):  # 100 read as seconds where milliseconds were meant
            raise ScenarioError(f"--slo: {item.strip()!r}: give the limit's unit (e.g. {name}={m.group(2)}ms or "
                                f"{name}={m.group(2)}s; a name ending in _s takes seconds)")
        name = name.removesuffix("_s")
        if name not in SLO_METRICS:
            raise ScenarioError(f"--slo: unknown metric {name!r} in {item.strip()!r}; use {', '.join(SLO_METRICS)}")
        if unit not in UNITS:
            raise ScenarioError(f"--slo: unknown unit {unit!r} in {item.strip()!r}; use s, ms, us or min")
        if value <= 0:
            raise ScenarioError(f"--slo: {item.strip()!r}: the limit must be > 0")
        if not math.isfinite(value * UNITS[unit]):  # 1e400s reads as inf: a limit every probe would meet
            raise ScenarioError(f"--slo: {item.strip()!r}: the limit must be a finite number")
        if f"{name}_s" in out:  # the second would silently replace the first
            raise ScenarioError(f"--slo: {name} given twice (in {text.strip()!r}); give each metric one limit")
        out[f"{name}_s"] = value * UNITS[unit]
    if not out:
        raise ScenarioError("--slo: give at least one limit, e.g. ttft_p99=2s,tpot_p99=100ms")
    return out


def meets(summary: dict, slo: dict[str, float]) -> bool:
    """Whether a probe's summary holds every limit of ``slo``: every request completed, each figure within its
    limit. A figure that no completed request has (TPOT, when every output is one token) cannot be judged at
    any rate: a ScenarioError naming it, not a capacity of zero."""
    if summary.get("rejected", 0) or summary.get("completed", 1) < summary.get("requests", 0):
        return False
    for k in slo:
        if summary[k] != summary[k] and summary.get("completed", 0):  # NaN over completed requests
            raise ScenarioError(f"--slo {k}: none of the {summary['completed']} completed requests has a "
                                f"{k.rsplit('_', 2)[0].upper()} (a TPOT needs two output tokens or more): drop it "
                                "from --slo, or let the workload's outputs be longer")
    return all(summary[k] == summary[k] and summary[k] <= v for k, v in slo.items())  # NaN (nothing done) fails


@dataclass
class CapacityResult:
    policy: str
    rate: float  # highest passing rate found (0 if none)
    upper: float  # lowest failing rate found (inf if none)
    probes: list[dict] = field(default_factory=list)  # {rate, ok, <slo metrics>, throughput_rps}
    note: str = ""


def search(probe: Callable[[float], dict], slo: dict[str, float], lo: float, hi: float, *,
           rel_tol: float = 0.02, max_probes: int = 24, policy: str = "") -> CapacityResult:
    """Bisection for the largest rate with ``meets(probe(rate), slo)``."""
    res = CapacityResult(policy, 0.0, math.inf)

    def test(rate: float) -> bool:
        s = probe(rate)
        ok = meets(s, slo)
        res.probes.append({"rate": rate, "ok": ok, **{k: s.get(k) for k in slo},
                           "throughput_rps": s.get("throughput_rps"), "rejected": s.get("rejected", 0)})
        return ok

    budget = max_probes
    # bracket: hi fails
    while budget > 0:
        budget -= 1
        if not test(hi):
            res.upper = hi
            break
        res.rate = hi
        lo, hi = hi, hi * 2
    else:
        res.note = f"SLO still met at {res.rate:g} req/s (probe budget spent); capacity is higher"
        return res
    # bracket: lo passes (unless already known)
    if res.rate == 0.0:
        while budget > 0:
            budget -= 1
            if test(lo):
                res.rate = lo
                break
            res.upper = lo
            lo /= 2
            if lo < 1e-6:
                break
        if res.rate == 0.0:
            res.note = f"SLO not met even at {res.upper:g} req/s"
            return res
    # bisect
    lo, hi = res.rate, res.upper
    while budget > 0 and (hi - lo) / hi > rel_tol:
        budget -= 1
        mid = 0.5 * (lo + hi)
        if test(mid):
            lo = res.rate = mid
        else:
            hi = res.upper = mid
    if (hi - lo) / hi > rel_tol:
        res.note = f"probe budget spent at ({lo:g}, {hi:g}) req/s"
    return res


def simulate_probe(scenario: Scenario, out: Path | None = None) -> Callable[[float], dict]:
    """``probe(rate)``: the scenario simulated at that rate; with ``out``, kept in OUT/probes.jsonl (a probe
    already there is read, not simulated)."""
    from granisim.experiments.probes import ProbeLog
    from granisim.experiments.sweep import simulate_scenario

    log = ProbeLog(out) if out is not None else None

    def probe(rate: float) -> dict:
        sc = scenario.with_changes(**{"workload.rate": float(rate)})
        if log is None:
            return simulate_scenario(sc)
        s, fresh = log.run(sc, lambda: simulate_scenario(sc), f"{scenario.policy.name} {rate:g} req/s")
        print(f"  {scenario.policy.name}, {rate:g} req/s: simulated" if fresh else
              f"  {scenario.policy.name}, {rate:g} req/s: kept in {log.path}", file=sys.stderr, flush=True)
        return s

    return probe


def _search_policy(args: tuple) -> CapacityResult:
    scenario_json, policy, slo, lo, hi, rel_tol, max_probes, out = args
    from granisim.config.scenario import parse_scenario

    sc = parse_scenario(json.loads(scenario_json)).with_changes(**{"policy.name": policy})
    return search(simulate_probe(sc, out), slo, lo, hi, rel_tol=rel_tol, max_probes=max_probes, policy=policy)


def capacity_table(results: list[CapacityResult], slo: dict[str, float]) -> str:
    head = f"{'policy':<10}{'max rate':>11}{'fails at':>11}" + "".join(f"{k[:-2]:>11}" for k in slo) + \
        f"{'tput r/s':>10}{'probes':>8}"
    lines = [head, "-" * len(head)]
    for r in results:
        best = max((p for p in r.probes if p["ok"]), key=lambda p: p["rate"], default=None)
        cells = "".join(f"{best[k]:>11.4f}" if best else f"{'-':>11}" for k in slo)
        tput = f"{best['throughput_rps']:>10.3f}" if best else f"{'-':>10}"
        lines.append(f"{r.policy:<10}{r.rate:>11.3f}{r.upper:>11.3f}{cells}{tput}{len(r.probes):>8}"
                     + (f"  ({r.note})" if r.note else ""))
    return "\n".join(lines)


def plot_capacity(results: list[CapacityResult], slo: dict[str, float], path: Path, title: str = "") -> None:
    from granisim.experiments.plots import latency_axis, metric_label, plt, save_figure  # sets the Agg backend

    fig, axes = plt.subplots(1, len(slo), figsize=(6 * len(slo), 4.5), squeeze=False)
    for ax, (k, limit) in zip(axes[0], slo.items()):
        for r in results:
            pts = sorted((p["rate"], p[k]) for p in r.probes if p[k] is not None and p[k] == p[k])
            if pts:
                line, = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=r.policy)
                if r.rate > 0:
                    ax.axvline(r.rate, color=line.get_color(), ls=":", lw=1)
        ax.axhline(limit, color="red", ls="--", lw=1, label=f"SLO {limit:g} s")
        latency_axis(ax, [limit], *[[p[k] for p in r.probes if p[k] is not None] for r in results], which="y")
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel(metric_label(k))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "capacity within SLO (dotted: highest passing rate)")
    save_figure(fig, path)


def capacity(scenario: Scenario, policies: list[str], slo: dict[str, float], out: Path, *, lo: float | None = None,
             hi: float | None = None, rel_tol: float = 0.02, max_probes: int = 24,
             workers: int | None = None) -> list[CapacityResult]:
    rate = scenario.workload.rate
    given_lo, given_hi = lo, hi
    lo = lo or rate / 8
    hi = hi or rate * 2
    if not 0 < lo < hi:  # a default is named as one: the user may have given only the other bound
        lo_s = f"--lo {lo:g}" + ("" if given_lo else f" (default: workload.rate {rate:g} / 8)")
        hi_s = f"--hi {hi:g}" + ("" if given_hi else f" (default: workload.rate {rate:g} x 2)")
        raise ScenarioError(f"{lo_s} / {hi_s}: need 0 < lo < hi")
    blob = json.dumps(scenario.model_dump(mode="json"))
    jobs = [(blob, pol, slo, lo, hi, rel_tol, max_probes, out) for pol in policies]
    workers = min(workers or len(jobs), len(jobs))
    if workers > 1:
        from granisim.experiments.stopping import process_pool

        with process_pool(workers) as ex:  # SIGINT / SIGTERM terminate the workers at once
            results = list(ex.map(_search_policy, jobs))
    else:
        results = [_search_policy(j) for j in jobs]
    out.mkdir(parents=True, exist_ok=True)
    tidy(out)  # the policies' probes in a fixed order, however the parallel searches finished
    (out / "capacity.json").write_text(strict_json({
        "scenario": scenario.model_dump(mode="json"), "slo": slo, "rel_tol": rel_tol,
        "results": [{"policy": r.policy, "max_rate": r.rate, "fails_at": None if math.isinf(r.upper) else r.upper,
                     "note": r.note, "probes": r.probes} for r in results]}, indent=2))
    (out / "capacity.txt").write_text(capacity_table(results, slo) + "\n")
    plot_capacity(results, slo, out / "capacity.png", f"{scenario.name}: highest rate within SLO")
    return results


def replay_field(wl) -> str:
    """The field that makes a workload a trace replay, with its value: kind = 'azure' (always a replay), else
    arrivals = 'trace'."""
    return f"workload.kind = {wl.kind!r}" if wl.kind == "azure" else f"workload.arrivals = {wl.arrivals!r}"


def capacity_cli(args) -> int:
    from granisim.config.scenario import ScenarioError, check_effective_in_runs, read_scenario, scenario_runs
    from granisim.experiments.compare import (DEMO_POLICIES, own_policies, parse_names, policy_scenarios,
                                              refuse_policies)
    from granisim.experiments.sensitivity import scaled_scenarios

    scenario, written = read_scenario(args.scenario)  # its policy-dependent fields: checked against the policies
    wl = scenario.workload
    if wl.kind == "azure" or wl.arrivals == "trace":  # the search varies workload.rate, which a replay ignores
        raise ScenarioError(f"{args.scenario}: field {replay_field(wl)}: "
                            "capacity searches the Poisson rate; a trace replay's arrivals have no rate to vary "
                            "(use workload.arrivals = \"poisson\" with workload.kind = \"multi_agent\" or \"control\")")
    slo = parse_slo(args.slo)
    # a fleet whose groups all set their policy is searched as written (the policies would change nothing)
    default = scenario.policy.name if own_policies(scenario) else DEMO_POLICIES
    if args.policies is not None and own_policies(scenario):
        refuse_policies(scenario, args.scenario, args.policies)
    policies = parse_names("--policies", default if args.policies is None else args.policies, DEMO_POLICIES)
    policy_scenarios(scenario, args.scenario, policies)  # names and budgets, early: one line, before any probe
    label = "--policies" if args.policies is not None else "capacity's default --policies"
    check_effective_in_runs(written, scenario_runs(scenario, policies=policies), args.scenario,
                            f" (in every run of {label} {','.join(policies)})")
    if args.sensitivity is not None:  # its scaled scenarios checked before any probe
        scaled_scenarios(scenario, args.scenario, args.sensitivity)
    out = out_folder(args.out, f"out/{scenario.name}-capacity")
    print(f"capacity of {scenario.name} within " + ", ".join(f"{k[:-2]} <= {v:g} s" for k, v in slo.items())
          + f" ({scenario.workload.num_requests or 'all'} requests per probe)")
    results = capacity(scenario, policies, slo, out, lo=args.lo, hi=args.hi, rel_tol=args.rel_tol,
                       max_probes=args.max_probes, workers=args.workers)
    print(capacity_table(results, slo))
    print(f"\nwrote {out}/ (capacity.json, capacity.txt, capacity.png)")
    if args.sensitivity is not None:
        d, scaled = args.sensitivity, {}
        for f, sc in scaled_scenarios(scenario, args.scenario, d):
            print(f"\nevery step x {f:g}:")
            scaled[f] = capacity(sc, policies, slo, out / f"steps_x{f:g}", lo=args.lo, hi=args.hi,
                                 rel_tol=args.rel_tol, max_probes=args.max_probes, workers=args.workers)
        table = sensitivity_rows(results, scaled)
        (out / "capacity_sensitivity.json").write_text(strict_json({"delta": d, "rows": table}, indent=2) + "\n")
        print("\n" + sensitivity_table(table, d) + f"\nwrote {out}/capacity_sensitivity.json (and steps_x*/)")
    return 0


def sensitivity_rows(base: list[CapacityResult], scaled: dict[float, list[CapacityResult]]) -> list[dict]:
    """Per policy: the highest rate within the SLO as priced and with every step scaled by each factor (pure)."""
    rows = []
    for i, r in enumerate(base):
        at = {f"{f:g}": {"max_rate": res[i].rate, "change": (res[i].rate - r.rate) / r.rate if r.rate else None}
              for f, res in sorted(scaled.items())}
        rows.append({"policy": r.policy, "max_rate": r.rate, "at": at})
    return rows


def sensitivity_table(rows: list[dict], delta: float) -> str:
    factors = list(rows[0]["at"]) if rows else []
    head = f"{'policy':<10}{'max rate':>11}" + "".join(f"{'steps x' + f:>20}" for f in factors)
    lines = [f"capacity sensitivity: every step's time x (1 -+ {delta:g})", head, "-" * len(head)]
    for r in rows:
        cells = "".join(f"{a['max_rate']:>11.3f}" + (f" ({a['change']:+.1%})" if a["change"] is not None else " " * 9)
                        for a in r["at"].values())
        lines.append(f"{r['policy']:<10}{r['max_rate']:>11.3f}{cells}")
    return "\n".join(lines)
