"""The same arrivals under several policies, side by side: one simulated (or real-engine) run per
policy, a summary table, compare.json/.txt and plots; the built-in demo scenario."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from granisim.config.scenario import Scenario, ScenarioError, load_scenario
from granisim.core.metrics import summary_json

DEMO_POLICIES = "granikv,token,paged16"


def parse_names(option: str, text: str, example: str) -> list[str]:
    """A comma-separated option's names, in order: at least one, none empty (a stray comma is a typo, not a name
    to drop), none given twice (each names one run)."""
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise ScenarioError(f"{option}: give at least one name, e.g. {example}")
    if not all(names):
        raise ScenarioError(f"{option} {text!r}: an empty name (a stray comma); give names like {example}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ScenarioError(f"{option} {text}: {', '.join(twice)} given twice; name each once")
    return names


def own_policies(scenario: Scenario) -> bool:
    """Whether every [[fleet.groups]] entry sets its own policy (so [policy] name runs on no replica)."""
    groups = scenario.fleet.groups if scenario.fleet is not None else ()
    return bool(groups) and all(g.policy is not None for g in groups)


def refuse_policies(scenario: Scenario, source: str, given: str) -> None:
    """``--policies`` given for a fleet whose every group sets its own policy: no replica would run them (and the
    runs would be labelled with names none of them ran)."""
    groups = scenario.fleet.groups
    raise ScenarioError(f"--policies {given}: every [[fleet.groups]] entry of {source} sets its own "
                        f"policy ({', '.join(g.policy for g in groups)}), so no replica would run these; leave "
                        f"policy out of the groups that should take them")


def policy_scenarios(scenario: Scenario, source: str, policies: list[str]) -> dict[str, Scenario]:
    """The scenario under each of ``policies`` (from --policies), every one resolved (policy name, page size, KV
    budget) before any of them runs: a bad name is one line naming --policies, not an error after the first runs."""
    from granisim.experiments.run import prepare

    if own_policies(scenario) and policies != [scenario.policy.name]:  # [policy] name runs on no replica
        refuse_policies(scenario, source, ",".join(policies))
    out = {}
    for pol in policies:
        try:
            sc = scenario.with_changes(**{"policy.name": pol})
        except ScenarioError as err:
            raise ScenarioError(f"--policies {','.join(policies)}: {str(err).removeprefix('<override>: ')}") from None
        prepare(sc, source)
        out[pol] = sc
    return out


def demo_scenario() -> tuple[Scenario, str]:
    ref = resources.files("granisim.config.scenarios").joinpath("demo.toml")
    with resources.as_file(ref) as p:
        return load_scenario(p), str(p)


def run_one(scenario: Scenario, source: str, out: Path, progress: bool = True, make_executor=None) -> dict:
    """Simulate (or, with ``make_executor(setup)``, run on another executor) one scenario; write its outputs."""
    from granisim.experiments.run import prepare, simulate, write_outputs

    if scenario.fleet is not None:  # N replicas behind a router
        from granisim.fleet.build import run_fleet

        return run_fleet(scenario, source, out, progress, make_executor)
    setup = prepare(scenario, source)
    executor = make_executor(setup) if make_executor else None
    return write_outputs(setup, simulate(setup, executor, progress=progress), out)


def summary_table(rows: dict[str, dict]) -> str:
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


def compare(scenario: Scenario, source: str, policies: list[str], out: Path, progress: bool = True) -> dict:
    import pandas as pd

    from granisim.experiments.plots import plot_compare

    summaries, reqs = {}, {}
    for pol, sc in policy_scenarios(scenario, source, policies).items():
        summaries[pol] = run_one(sc, source, out / pol, progress)
        reqs[pol] = pd.read_parquet(out / pol / "requests.parquet")
    (out / "compare.json").write_text(summary_json(summaries))
    table = summary_table(summaries)
    (out / "compare.txt").write_text(table + "\n")
    plot_compare(summaries, reqs, out, title=f"{scenario.name}: {', '.join(policies)}")
    return summaries
