"""Sweeps and the capacity rate search simulate a [fleet] section as the fleet, not one GPU."""

import json

from granisim.cli import main
from granisim.experiments.sweep import run_sweep
from granisim.experiments.sweep_file import load_sweep

BASE = """
seed = 3
[{p}workload]
roles = 4
prefix_len = 512
num_requests = 40
rate = 40.0
max_output_len = 16
[{p}fleet]
replicas = 3
"""

KEYS = ("completed", "throughput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
        "prefix_hit_rate", "num_replicas", "router")


def test_a_sweep_over_the_router_gives_the_figures_of_granisim_run(tmp_path):
    """Fails on the old simulate_scenario (one GPU for every point: no `router`, other figures)."""
    sweep = tmp_path / "s.toml"
    sweep.write_text("name = 'routers'\n[base]\n" + BASE.format(p="base.")
                     + '[grid]\n"fleet.router" = ["round_robin", "hot_aware"]\n')
    rows = run_sweep(load_sweep(str(sweep)), tmp_path / "sw", workers=1, progress=False)
    assert len(rows) == 2
    for router in ("round_robin", "hot_aware"):
        sc = tmp_path / f"{router}.toml"
        sc.write_text(f"name = '{router}'\n" + BASE.format(p="") + f'router = "{router}"\n')
        assert main(["run", str(sc), "--out", str(tmp_path / router)]) == 0
        want = json.loads((tmp_path / router / "summary.json").read_text())
        got = rows[rows["fleet.router"] == router].iloc[0]
        assert want["num_replicas"] == 3
        for k in KEYS:
            assert got[k] == want[k], (router, k)
    a, b = (rows[rows["fleet.router"] == r].iloc[0] for r in ("round_robin", "hot_aware"))
    assert a.prefix_hit_rate != b.prefix_hit_rate  # the router mattered
