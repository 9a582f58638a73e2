"""Admission rule and host tier at high tenancy on the real engine: throughput at k roles over the k = 4 figure.

Reads units that `reports/host_tier/run_validation.sh` left on one machine (each UNIT folder holds
`validation.json`; its scenario is `../scenarios/host_tier_<unit>.toml`), prints a table and writes a JSON summary:

    python reports/host_tier/admission_engine.py OUT_K4/granikv_none OUT_K64/granikv_none ... \
        [--with EARLIER.json] --out reports/host_tier/admission_engine.json

Per unit: roles, admission rule, tier and write rule (from the scenario), measured and predicted req/s and TTFT
p99, and both throughputs over the same-machine unit with the fewest roles (the k = 4 reference).
"""
from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path


def read_unit(folder: Path) -> dict:
    scenario = folder.parent / "scenarios" / f"host_tier_{folder.name}.toml"
    try:
        sc = tomllib.loads(scenario.read_text())
        v = json.loads((folder / "validation.json").read_text())
    except (OSError, ValueError) as err:
        print(f"{folder}: not a run_validation.sh unit ({err})", file=sys.stderr)
        raise SystemExit(2)
    e2e = v["end_to_end"]
    tier = sc["policy"].get("host_tier", "none")
    return {
        "unit": str(folder), "roles": sc["workload"]["roles"],
        "admission": sc.get("scheduler", {}).get("admission", "fcfs"),
        "host_tier": tier, "host_write": None if tier == "none" else sc["policy"].get("host_write", "all"),
        "req_s": e2e["throughput_rps"]["measured"], "predicted_req_s": e2e["throughput_rps"]["predicted"],
        "ttft_p99_s": e2e["ttft_p99_s"]["measured"], "predicted_ttft_p99_s": e2e["ttft_p99_s"]["predicted"],
        "step_median_error": v["step_errors"]["total"]["median"], "device": v["device"], "date": v["date"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("units", type=Path, nargs="*")
    ap.add_argument("--with", dest="earlier", type=Path, action="append", default=[],
                    help="a JSON this script wrote: its units join the table (their raw runs need not be at hand)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = [read_unit(f) for f in a.units]
    for path in a.earlier:
        try:
            rows += [{k: v for k, v in r.items() if "over_reference" not in k} for r in json.loads(path.read_text())["units"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"{path}: not a JSON of this script ({err})", file=sys.stderr)
            raise SystemExit(2)
    if not rows:
        ap.error("no units: give unit folders or --with JSON")
    rows.sort(key=lambda r: (r["roles"], r["admission"], r["host_tier"]))
    ref = rows[0]
    for r in rows:
        r["over_reference"] = r["req_s"] / ref["req_s"]
        r["predicted_over_reference"] = r["predicted_req_s"] / ref["predicted_req_s"]
    print("| k | admission | tier (write) | req/s measured / predicted | over k = 4, measured / predicted "
          "| TTFT p99 measured / predicted |")
    print("| ---: | --- | --- | --- | --- | --- |")
    for r in rows:
        tier = "none" if r["host_tier"] == "none" else f"{r['host_tier']} ({r['host_write']})"
        print(f"| {r['roles']} | {r['admission']} | {tier} | {r['req_s']:.2f} / {r['predicted_req_s']:.2f} "
              f"| {r['over_reference']:.3f} / {r['predicted_over_reference']:.3f} "
              f"| {r['ttft_p99_s']:.1f} / {r['predicted_ttft_p99_s']:.1f} s |")
    if a.out:
        a.out.write_text(json.dumps({"reference": ref["unit"], "units": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
