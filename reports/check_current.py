"""Are the committed simulated figures still what the code gives? Re-run the commands behind the report pages
whose files a CPU writes (simulations and the calibration fits) and compare their outputs with the committed ones.

    python reports/check_current.py [PART ...] [--keep DIR]   # parts: demo capacity fleet host_tier calibration paper

Run it after changing the cost model, a profile, the scheduler or a workload. Each part prints MATCH or DIFF per
file (DIFF with the first values that differ) and the command that rewrites the committed files; exit status 1 if
any file differs. Text files must match exactly. JSON and CSV files must match value for value, floats to 1e-9
relative, apart from the run's own commit, date, wall time and command line. The figures the pages quote in prose
come from these files. The pages of GPU runs are checked by `reports/regenerate.sh` from the raw runs instead.
About 8 minutes on two cores for every part (`paper` about 4 of them).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = {"commit", "date", "wall_s", "command", "sim_wall_s"}  # a run's own, not a figure
FLEET = "scenarios/fleet_16roles.toml"
FLEET_CAPACITY = [FLEET, "--slo", "ttft_p99=2s,tpot_p99=50ms", "--rate", "24", "--max-replicas", "16",
                  "--routers", "round_robin,cache_aware,hot_aware", "--policies", "granikv", "--sensitivity"]
DEMO = "granisim/config/scenarios/demo.toml"

# part -> [(granisim arguments with OUT for the output folder, [(file written under OUT, committed file)])]
PARTS = {
    "demo": [(["demo", "--out", "OUT"], [("compare.txt", "reports/demo/compare.txt"),
                                         ("compare.json", "reports/demo/compare.json")])],
    "capacity": [
        (["capacity", DEMO, "--slo", "ttft_p99=2s,tpot_p99=100ms", "--out", "OUT", "--workers", "2"],
         [("capacity.txt", "reports/capacity/demo/capacity.txt"),
          ("capacity.json", "reports/capacity/demo/capacity.json")]),
        (["capacity", DEMO, "--slo", "ttft_p99=5s,tpot_p99=100ms", "--out", "OUT", "--workers", "2"],
         [("capacity.txt", "reports/capacity/demo-ttft5s/capacity.txt"),
          ("capacity.json", "reports/capacity/demo-ttft5s/capacity.json")])],
    "fleet": [
        (["capacity", *FLEET_CAPACITY, "--out", "OUT", "--workers", "2"],
         [("fleet_capacity.txt", "reports/fleet/capacity/fleet_capacity.txt"),
          ("fleet_capacity.json", "reports/fleet/capacity/fleet_capacity.json"),
          ("fleet_capacity_sensitivity.json", "reports/fleet/capacity/fleet_capacity_sensitivity.json")]),
        (["compare", FLEET, "--routers", "round_robin,least_load,cache_aware,role_affinity,hot_aware", "--out", "OUT"],
         [("compare.txt", "reports/fleet/compare/compare.txt"),
          ("compare.json", "reports/fleet/compare/compare.json")]),
        *[(["run", f"ROUTER={router}", "--sensitivity", "--out", "OUT"],
           [("sensitivity.json", f"reports/fleet/sensitivity/{router}.json")])
          for router in ("hot_aware", "cache_aware", "least_load")]],
    "host_tier": [(["sweep", f"sweeps/{name}.toml", "--out", "OUT", "--workers", "2"],
                   [("results.csv", f"reports/host_tier/sweeps/{name}.csv")])
                  for name in ("host_tier", "host_tier_steady", "host_tier_admission", "host_eviction", "host_write")],
    "calibration": [
        (["calibrate", "fit", f"calibration/raw/{raw}", "--out", f"OUT/{name}.json", "--report", "OUT"],
         [(f"{name}_fit.json", f"reports/calibration/{name}_fit.json")])
        for name, raw in (("h200", "h200"), ("h100-sxm", "h100/measure"))],
    "paper": [(["paper", "--out", "OUT", "--profiles", "a100-80gb,h200,h200-engine", "--num-requests", "400",
                "--workers", "2"], [("paper.json", "reports/paper/paper.json")])],
}


def differences(got, want, where: str = "") -> list[str]:
    """Where two JSON values differ (floats to 1e-9 relative; the VOLATILE keys skipped), first ones first."""
    if isinstance(got, dict) and isinstance(want, dict):
        out = []
        for k in sorted(set(got) | set(want), key=str):
            if k in VOLATILE:
                continue
            if k not in got or k not in want:
                out.append(f"{where}/{k}: only in the {'committed file' if k in want else 'new output'}")
            else:
                out += differences(got[k], want[k], f"{where}/{k}")
        return out
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items, committed {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{where}[{i}]")]
    if isinstance(got, float) or isinstance(want, float):
        if isinstance(got, (int, float)) and isinstance(want, (int, float)) \
                and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            return []
    elif got == want:
        return []
    return [f"{where}: {got!r}, committed {want!r}"]


def csv_rows(path: Path) -> list[dict]:
    """A CSV file's rows, numbers as floats."""
    def value(cell: str):
        try:
            return float(cell)
        except ValueError:
            return cell

    with path.open(newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def compare(new: Path, committed: Path) -> list[str]:
    if not new.is_file():
        return [f"{new} was not written"]
    if committed.suffix == ".json":
        return differences(json.loads(new.read_text()), json.loads(committed.read_text()))
    if committed.suffix == ".csv":
        return differences(csv_rows(new), csv_rows(committed))
    a, b = new.read_text().splitlines(), committed.read_text().splitlines()
    return [f"line {i + 1}: {x!r}, committed {y!r}" for i, (x, y) in enumerate(zip(a, b)) if x != y] + \
        ([f"{len(a)} lines, committed {len(b)}"] if len(a) != len(b) else [])


def command(args: list[str], out: Path, scratch: Path) -> list[str]:
    """The granisim command line of ``args``: OUT is the output folder; ROUTER=R runs the fleet example's scenario
    with its router set to R (the sensitivity pages' runs)."""
    cmd = []
    for a in args:
        if a.startswith("ROUTER="):
            router = a.split("=", 1)[1]
            text = (ROOT / FLEET).read_text()
            if 'router = "hot_aware"' not in text:
                raise SystemExit(f"error: {FLEET}: expected its [fleet] router = \"hot_aware\" line to change")
            scenario = scratch / f"fleet_16roles_{router}.toml"
            scenario.write_text(text.replace('router = "hot_aware"', f'router = "{router}"'))
            a = str(scenario)
        cmd.append(str(out) + a[3:] if a == "OUT" or a.startswith("OUT/") else a)
    return [sys.executable, "-m", "granisim.cli", *cmd]


def check(part: str, scratch: Path) -> bool:
    ok = True
    for i, (args, files) in enumerate(PARTS[part]):
        out = scratch / f"{part}_{i}"
        cmd = command(args, out, scratch)
        shown = "granisim " + " ".join("DIR" + a[3:] if a == "OUT" or a.startswith("OUT/") else a for a in args)
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{part}: FAILED ({shown}): {(run.stderr.strip().splitlines() or ['no output'])[-1]}")
            ok = False
            continue
        for name, committed in files:
            diffs = compare(out / name, ROOT / committed)
            print(f"{part}: {'MATCH' if not diffs else 'DIFF '} {committed}")
            for d in diffs[:5]:
                print(f"    {d}")
            if diffs:
                print(f"    ({len(diffs)} differences; rewritten by: {shown})")
                ok = False
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", metavar="PART", help=f"of: {', '.join(PARTS)} (default: all)")
    ap.add_argument("--keep", type=Path, help="write the new outputs under this folder and keep them")
    args = ap.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        print(f"error: unknown part {unknown[0]!r} (parts: {', '.join(PARTS)})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="check-current-") as tmp:
        scratch = args.keep if args.keep is not None else Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        results = [check(part, scratch.resolve()) for part in (args.parts or PARTS)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
