"""Does the serving loop's own host time tell a machine's host speed? The same unit on two machines, side by side.

    python reports/validation/host_loop/pairs.py RAW/validation/run{T1,U1,V1,W1,Z1} \
        --out reports/validation/host_loop/pairs.json

For every unit (workload, policy, model) that ran on two or more of the given machines, and whose steps carry
``host_between_s`` (the serving loop's host work before each step: scheduling, allocation, applying the previous
result; the same code on every machine), the ratio between two machines of
- the loop's host time, median per step;
- the engine's host part (``measured_overhead``: metadata build and upload, launches), median per step;
- the engine's host part over its price (summed over the unit's steps), the "host factor".
The unit's work is the same on both machines, so the ratios compare the hosts alone. Prints the table and the
correlation of the log ratios; writes JSON. CPU only.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from pathlib import Path

import pandas as pd

from granisim.validation.clock_term import units_folder


def unit_figures(run: Path) -> dict[str, dict]:
    """unit name -> loop and host-part medians (ms) and host factor, for units that recorded the loop's time."""
    out = {}
    for f in sorted(units_folder(run).glob("*/steps.parquet")):
        d = pd.read_parquet(f)
        if "host_between_s" not in d or d.host_between_s.isna().all():
            continue
        out[f.parent.name] = {"loop_ms": float(d.host_between_s.median() * 1e3),
                              "host_part_ms": float(d.measured_overhead.median() * 1e3),
                              "host_factor": float(d.measured_overhead.sum() / d.predicted_overhead.sum()),
                              "steps": len(d)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    by_run = {}
    for r in a.runs:
        if not r.is_dir():
            ap.exit(2, f"{r}: no such run folder\n")
        by_run[r.name] = unit_figures(r)
    pairs = []
    for (ra, ua), (rb, ub) in itertools.combinations(by_run.items(), 2):
        for unit in sorted(ua.keys() & ub.keys()):
            x, y = ua[unit], ub[unit]
            pairs.append({"unit": unit, "a": ra, "b": rb, **{f"{k}_ratio": y[k] / x[k] for k in
                                                              ("loop_ms", "host_part_ms", "host_factor")}})
    if len(pairs) < 3:
        ap.exit(2, f"{len(pairs)} unit(s) ran on two of these machines with the loop's time recorded; need 3\n")
    logs = {k: [math.log(p[f"{k}_ratio"]) for p in pairs] for k in ("loop_ms", "host_part_ms", "host_factor")}
    corr = {k: statistics.correlation(logs["loop_ms"], logs[k]) for k in ("host_part_ms", "host_factor")}
    print("| unit | machines | loop b/a | host part b/a | host factor b/a |")
    print("| --- | --- | ---: | ---: | ---: |")
    for p in pairs:
        print(f"| {p['unit']} | {p['a']} -> {p['b']} | {p['loop_ms_ratio']:.2f} | {p['host_part_ms_ratio']:.2f} "
              f"| {p['host_factor_ratio']:.2f} |")
    print(f"\n{len(pairs)} pairs; correlation of log ratios, loop against host part {corr['host_part_ms']:.2f}, "
          f"against host factor {corr['host_factor']:.2f}")
    if a.out:
        a.out.write_text(json.dumps({"units": by_run, "pairs": pairs, "correlation_of_log_ratios": corr},
                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
