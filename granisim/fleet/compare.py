"""The same arrivals behind several routers: one fleet run per router, a table, compare.json/.txt, plots."""

from __future__ import annotations

from pathlib import Path

from granisim.config.scenario import Scenario, ScenarioError
from granisim.config.scenario import ROUTERS
from granisim.core.metrics import summary_json


def parse_routers(text: str) -> list[str]:
    from granisim.experiments.compare import parse_names

    names = parse_names("--routers", text, "round_robin,cache_aware,hot_aware")
    for r in names:
        if r not in ROUTERS:
            raise ScenarioError(f"--routers: unknown router {r!r}; use {', '.join(ROUTERS)}")
    return names


def compare_routers(scenario: Scenario, source: str, routers: list[str], out: Path, progress: bool = True) -> dict:
    import pandas as pd

    from granisim.experiments.plots import plot_compare
    from granisim.fleet.build import run_fleet, with_router
    from granisim.fleet.outputs import routers_table

    summaries, reqs = {}, {}
    for r in routers:
        summaries[r] = run_fleet(with_router(scenario, r), source, out / r, progress)
        reqs[r] = pd.read_parquet(out / r / "requests.parquet")
    (out / "compare.json").write_text(summary_json(summaries))
    (out / "compare.txt").write_text(routers_table(summaries) + "\n")
    plot_compare(summaries, reqs, out, title=f"{scenario.name}: {', '.join(routers)}")
    return summaries
