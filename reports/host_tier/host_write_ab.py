"""The host tier's write-back rule (`policy.host_write` = all / reused) on the real engine, A/B with repetitions.

Reads the units that `reports/host_tier/run_validation.sh` left (one folder a repetition, named
`<machine>_<order>_<variant>/granikv_tier/` with `validation.json` and `steps.parquet`; `env_<machine>.txt`
beside them holds the machine's nvidia-smi line, versions, date and code commit), prints a table and writes a
JSON summary:

    python reports/host_tier/host_write_ab.py RAW_DIR --out reports/host_tier/host_write_ab.json

Per repetition: measured and predicted req/s, TTFT p99, TPOT p50/p99, and the seconds of KV copies the steps
measured (the sum of `steps.parquet`'s `measured_kv_copy`; predicted alongside). Per variant: median, min and max
over all repetitions, and per machine, since repetitions on one machine compare best (with `reused`'s gain
against `all` there).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import pandas as pd

FOLDER = re.compile(r"^(?P<machine>[A-Za-z0-9]+)_(?P<order>\d+)_(?P<variant>[a-z]+)$")
METRICS = ("req_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "kv_copy_s")


def read_env(path: Path) -> dict:
    env: dict = {}
    if not path.exists():
        return env
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("name,") and i + 1 < len(lines):
            fields = [f.strip() for f in lines[i + 1].split(",")]
            env["gpu"], env["driver"] = fields[0], fields[1]
        elif re.match(r"^\d+\.\d+.*\s\d+\.\d+", line) and "torch" not in env:
            torch, triton, cuda, python = line.split()[:4]
            env.update(torch=torch, triton=triton, cuda=cuda, python=python)
        elif line.startswith("commit "):
            env["commit"] = line.split()[1]
        elif re.search(r"\d{4}$", line) and "UTC" in line:
            env["started"] = line
    return env


def read_rep(folder: Path) -> dict:
    m = FOLDER.match(folder.name)
    unit = folder / "granikv_tier"
    v = json.loads((unit / "validation.json").read_text())["end_to_end"]
    steps = pd.read_parquet(unit / "steps.parquet", columns=["measured_kv_copy", "predicted_kv_copy"])
    return {
        "machine": m["machine"], "order": int(m["order"]), "variant": m["variant"],
        "req_s": v["throughput_rps"]["measured"], "predicted_req_s": v["throughput_rps"]["predicted"],
        "ttft_p99_s": v["ttft_p99_s"]["measured"], "predicted_ttft_p99_s": v["ttft_p99_s"]["predicted"],
        "tpot_p50_s": v["tpot_p50_s"]["measured"], "tpot_p99_s": v["tpot_p99_s"]["measured"],
        "kv_copy_s": float(steps["measured_kv_copy"].sum()),
        "predicted_kv_copy_s": float(steps["predicted_kv_copy"].sum()),
    }


def spread(reps: list[dict]) -> dict:
    out: dict = {"n": len(reps)}
    for k in METRICS + ("predicted_req_s",):
        xs = [r[k] for r in reps]
        out[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    folders = [f for f in a.raw.iterdir() if f.is_dir() and FOLDER.match(f.name)] if a.raw.is_dir() else []
    if not folders:
        print(f"{a.raw}: no <machine>_<order>_<variant> unit folders", file=sys.stderr)
        raise SystemExit(2)
    reps = sorted(map(read_rep, folders), key=lambda r: (r["machine"], r["order"]))
    names = sorted({r["machine"] for r in reps})
    machines = {c: read_env(a.raw / f"env_{c}.txt") for c in names}
    variants = sorted({r["variant"] for r in reps})
    summary = {
        "workload": "host_tier granikv_tier, ROLES=16 (run_validation.sh defaults otherwise)",
        "machines": machines,
        "reps": reps,
        "by_variant": {v: spread([r for r in reps if r["variant"] == v]) for v in variants},
        "by_machine": {c: {v: spread(rs) for v in variants
                           if (rs := [r for r in reps if r["machine"] == c and r["variant"] == v])}
                       for c in names},
    }
    print("machine order variant   req/s (pred)    TTFT p99  TPOT p50  TPOT p99  kv_copy s (pred)")
    for r in reps:
        print(f"{r['machine']:>7} {r['order']:>5} {r['variant']:<7} {r['req_s']:6.2f} ({r['predicted_req_s']:5.2f})"
              f"  {r['ttft_p99_s']:7.2f}s  {r['tpot_p50_s'] * 1e3:6.1f}ms  {r['tpot_p99_s'] * 1e3:6.1f}ms"
              f"  {r['kv_copy_s']:6.2f} ({r['predicted_kv_copy_s']:5.2f})")
    print("\nvariant  n  median [min-max]: req/s | TTFT p99 s | TPOT p99 ms | kv_copy s")
    for v, s in summary["by_variant"].items():
        f = lambda k, scale=1.0, p=2: (f"{s[k]['median'] * scale:.{p}f} [{s[k]['min'] * scale:.{p}f}-"
                                       f"{s[k]['max'] * scale:.{p}f}]")
        print(f"{v:<7} {s['n']:>2}  {f('req_s')} | {f('ttft_p99_s')} | {f('tpot_p99_s', 1e3, 1)} | {f('kv_copy_s')}")
    gains = {}
    for c, by in summary["by_machine"].items():
        if {"all", "reused"} <= by.keys():
            g = {k: by["reused"][k]["median"] / by["all"][k]["median"] - 1 for k in ("req_s", "ttft_p99_s")}
            gains[c] = g
            print(f"machine {c}: reused against all, req/s {g['req_s']:+.1%}, TTFT p99 {g['ttft_p99_s']:+.1%}")
    summary["reused_vs_all_by_machine"] = gains
    if a.out:
        a.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
