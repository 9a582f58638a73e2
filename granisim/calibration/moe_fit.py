"""Fit the grouped-GEMM coefficients and check the per-shard GEMMs, from a calibration run.

    python -m granisim.calibration.moe_fit RAW_DIR --profile granisim/config/profiles/h200.json [--write]

RAW_DIR is a ``python -m calibration.measure --only linear_tp,grouped_gemm`` output (calibration/measure/moe.py).

* ``grouped_gemm.csv`` -> ``linear.moe_up.*`` / ``linear.moe_down.*``: the roofline of the linear families
  (``t = launch_s + max(F / (P flop_eff), B / (BW mem_eff))``, granisim.costmodel.fit_roofline) fitted per
  family on every other row, its relative error reported on the rows left out (held out), then refitted on
  all rows; ``--write`` puts them into the profile as ``measured`` (replacing the dense-roofline
  extrapolation granisim.calibration.collectives put there).
* ``linear_tp.csv``: the profile's own linear families priced at the per-shard shapes of tp = 2, 4, 8 against
  these timings — the held-out check that the tp = 1 fit carries to the shard shapes (nothing is refitted).

The H200 numbers are not measured yet (the run needs a GPU session); the shipped profiles carry the
extrapolated coefficients until then.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from granisim.config.hardware import load_profile
from granisim.costmodel.operators import fit_roofline, roofline_time

MAX_LAUNCH = 10e-6


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _err(pred, t) -> dict:
    e = np.abs(np.asarray(pred) / np.asarray(t) - 1.0)
    return {"median": float(np.median(e)), "p90": float(np.quantile(e, 0.9)), "n": int(e.size)}


def fit_grouped(raw_dir: Path, peak: float, bw: float) -> tuple[dict, dict]:
    """(values: coefficient name -> value, errors: family -> held-out relative errors)."""
    rows = _rows(Path(raw_dir) / "grouped_gemm.csv")
    values, errors = {}, {}
    for fam in ("moe_up", "moe_down"):
        r = [x for x in rows if x["family"] == fam]
        if len(r) < 4:
            raise ValueError(f"{raw_dir}/grouped_gemm.csv: {len(r)} rows of {fam}, need at least 4")
        f = np.array([float(x["flops"]) for x in r])
        b = np.array([float(x["bytes"]) for x in r])
        t = np.array([float(x["median_us"]) for x in r]) * 1e-6
        train, test = np.arange(len(r)) % 2 == 0, np.arange(len(r)) % 2 == 1
        c, ef, em = fit_roofline(f[train], b[train], t[train], peak, bw, MAX_LAUNCH)
        errors[fam] = _err(roofline_time(f[test], b[test], peak, bw, c, ef, em), t[test])
        c, ef, em = fit_roofline(f, b, t, peak, bw, MAX_LAUNCH)
        for k, v in (("launch_s", c), ("flop_eff", ef), ("mem_eff", em)):
            values[f"linear.{fam}.{k}"] = v
    return values, errors


def shard_errors(raw_dir: Path, profile) -> dict:
    """Relative errors of the profile's linear families on the per-shard GEMM timings, by tp."""
    rows = _rows(Path(raw_dir) / "linear_tp.csv")
    out = {}
    for tp in sorted({int(x["tp"]) for x in rows}):
        pred, t = [], []
        for x in (x for x in rows if int(x["tp"]) == tp):
            fam = x["family"]
            pred.append(float(roofline_time(float(x["flops"]), float(x["bytes"]), profile.bf16_flops,
                                            profile.hbm_bandwidth, profile[f"linear.{fam}.launch_s"],
                                            profile[f"linear.{fam}.flop_eff"], profile[f"linear.{fam}.mem_eff"])))
            t.append(float(x["median_us"]) * 1e-6)
        out[tp] = _err(pred, t)
    return out


def write(profile_path: Path, raw_dir: Path, values: dict) -> None:
    """Put the fitted grouped-GEMM coefficients into a profile file as measured."""
    meta = json.loads((Path(raw_dir) / "meta.json").read_text())
    doc = json.loads(Path(profile_path).read_text())
    src = {"kind": "measured", "date": meta.get("date", "?"), "command": meta.get("command", "?"),
           "gpu": meta.get("gpu", "?"), "commit": str(meta.get("commit", "?")),
           "versions": f"torch {meta.get('torch')}, triton {meta.get('triton')}"}
    for k, v in values.items():
        unit = "s" if k.endswith("launch_s") else ""
        doc["coefficients"][k] = {"value": float(v), "unit": unit, "source": src}
    Path(profile_path).write_text(json.dumps(doc, indent=2) + "\n")
    load_profile(profile_path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m granisim.calibration.moe_fit", description=__doc__.split("\n")[0])
    ap.add_argument("raw")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--write", action="store_true", help="write the grouped-GEMM fit into the profile")
    a = ap.parse_args(argv)
    prof = load_profile(a.profile)
    raw = Path(a.raw)
    if (raw / "grouped_gemm.csv").exists():
        try:
            values, errors = fit_grouped(raw, prof.bf16_flops, prof.hbm_bandwidth)
        except ValueError as e:
            print(f"error: {e}")
            return 2
        for fam, e in errors.items():
            print(f"grouped GEMM {fam}: held-out relative error median {e['median']:.1%}, p90 {e['p90']:.1%} "
                  f"({e['n']} rows)")
        for k, v in values.items():
            print(f"  {k} = {v:.6g}")
        if a.write:
            write(Path(a.profile), raw, values)
            print(f"wrote {a.profile}")
    if (raw / "linear_tp.csv").exists():
        for tp, e in shard_errors(raw, prof).items():
            print(f"per-shard GEMMs tp={tp}: {prof.name}'s linear families, relative error median {e['median']:.1%}, "
                  f"p90 {e['p90']:.1%} ({e['n']} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
