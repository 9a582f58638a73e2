"""The host's speed where the engine serves: CPU time a plan of the simulator's own serving loop on a fixed workload.

    granisim validation host-probe [--repeats 3]

The real engine's host part of a step (building and uploading its metadata, launching) is Python and numpy work, and
it runs 0.64-2.03x as long as the shipped profile prices it from one H200 machine to the next
(reports/validation/step_parts_by_machine.md). This probe times the same kind of work on a workload that is the
same everywhere: the first ``PROBE_REQUESTS`` requests of the bundled Azure trace under granikv on the ``h200``
profile, simulated with the cost model (no GPU), CPU time (``time.process_time``) per plan, the median of
``repeats`` runs. `granisim validation gpu-run validate` records it before every unit (``host_probe`` in the
unit's JSON; the report carries it), so that the engine's host part can be set against the host's speed measured
on the machine and minute it served. Prints one line and, with ``--out``, writes the figures as JSON.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from granisim.config.files import OneLineParser

PROBE_REQUESTS = 1000


def probe_setup():
    from granisim.config.scenario import parse_scenario
    from granisim.experiments.run import prepare

    return prepare(parse_scenario({"name": "host-probe", "seed": 0, "hardware": {"profile": "h200"},
                                   "workload": {"kind": "azure", "arrivals": "trace",
                                                "num_requests": PROBE_REQUESTS}}))


def probe(repeats: int = 3) -> dict:
    """{"us_per_plan": median CPU microseconds a plan, "plans": plans a run, "runs_s": each run's CPU seconds}."""
    from granisim.experiments.run import simulate

    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: give 1 or more")
    setup = probe_setup()
    runs, plans = [], None
    for _ in range(repeats):
        t = time.process_time()
        res = simulate(setup, progress=False)
        runs.append(time.process_time() - t)
        n = len(res.steps.frame())
        if plans is not None and n != plans:  # the same seed serves the same plans: anything else is a bug
            raise AssertionError(f"host probe: {n} plans in one run, {plans} in another")
        plans = n
    return {"us_per_plan": statistics.median(runs) / plans * 1e6, "plans": plans,
            "runs_s": [round(r, 4) for r in runs], "requests": PROBE_REQUESTS}


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation host-probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = ap.parse_args(argv)
    p = probe(args.repeats)
    print(f"host probe: {p['us_per_plan']:.1f} us of CPU a plan ({p['plans']} plans, median of {len(p['runs_s'])} runs)")
    if args.out:
        args.out.write_text(json.dumps(p, indent=1) + "\n")


if __name__ == "__main__":
    main()
