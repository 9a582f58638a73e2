"""Fit the grouped-GEMM coefficients and check the per-shard GEMMs, from a calibration run.

    python -m granisim.calibration.moe_fit RAW_DIR --profile granisim/config/profiles/h200.json [--write]

RAW_DIR is a ``python -m calibration.measure --only linear_tp,grouped_gemm`` output (calibration/measure/moe.py).

* ``grouped_gemm.csv`` -> ``linear.moe_up.*`` / ``linear.moe_down.*``: the roofline of the linear families
  (``t = launch_s + max(F / (P flop_eff), B / (BW mem_eff))``, granisim.costmodel.fit_roofline) fitted per
  family on every other row, its relative error reported on the rows left out (held out), then refitted on
  all rows; ``--write`` puts them into the profile as ``measured`` (replacing the dense-roofline
  extrapolation granisim.calibration.collectives put there).
* ``linear_tp.csv``: the profile's own linear families (``roofline``) and the cost model's table pricing
  (``table``: the nearest measured table carried by roofline ratios) at the per-shard shapes of tp = 2, 4, 8
  against these timings — the held-out check that tp = 1 measurements carry to the shard shapes (nothing is
  refitted), and the rows' own error at sizes left out (``rows held out``: what a per-shard table of them, as
  ``granisim calibrate table`` makes, gives between its measured sizes).

The H200 runs are in ``calibration/raw/h200_more/`` (calibration/README.md gives the figures).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from granisim.calibration.fit_linear import table_interp
from granisim.calibration.raw import measured_source
from granisim.config.hardware import load_profile, write_coefficients
from granisim.config.models import get_model
from granisim.costmodel.operators import fit_roofline, roofline_time
from granisim.costmodel.tables import carried_s, nearest_linear_table

# the linear table's column of each GEMM family (granisim.costmodel.operators.LAYER_OPS)
TABLE_COLUMN = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "mlp_up": "mlp_up_proj",
                "mlp_down": "mlp_down_proj"}

MAX_LAUNCH = 10e-6


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _err(pred, t) -> dict:
    e = np.abs(np.asarray(pred) / np.asarray(t) - 1.0)
    return {"median": float(np.median(e)), "p90": float(np.quantile(e, 0.9)), "n": int(e.size)}


def _family(rows: list[dict], fam: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flops, bytes, seconds) of the grouped_gemm.csv rows of one family."""
    r = [x for x in rows if x["family"] == fam]
    return (np.array([float(x["flops"]) for x in r]), np.array([float(x["bytes"]) for x in r]),
            np.array([float(x["median_us"]) for x in r]) * 1e-6)


def fit_grouped(raw_dir: Path, peak: float, bw: float) -> tuple[dict, dict]:
    """(values: coefficient name -> value, errors: family -> held-out relative errors)."""
    rows = _rows(Path(raw_dir) / "grouped_gemm.csv")
    values, errors = {}, {}
    for fam in ("moe_up", "moe_down"):
        f, b, t = _family(rows, fam)
        if len(t) < 4:
            raise ValueError(f"{raw_dir}/grouped_gemm.csv: {len(t)} rows of {fam}, need at least 4")
        train, test = np.arange(len(t)) % 2 == 0, np.arange(len(t)) % 2 == 1
        c, ef, em = fit_roofline(f[train], b[train], t[train], peak, bw, MAX_LAUNCH)
        errors[fam] = _err(roofline_time(f[test], b[test], peak, bw, c, ef, em), t[test])
        c, ef, em = fit_roofline(f, b, t, peak, bw, MAX_LAUNCH)
        for k, v in (("launch_s", c), ("flop_eff", ef), ("mem_eff", em)):
            values[f"linear.{fam}.{k}"] = v
    return values, errors


def profile_errors(raw_dir: Path, profile) -> dict:
    """family -> relative errors of the profile's own ``linear.moe_*`` coefficients (as they stand: nothing is
    fitted) on every row of a ``grouped_gemm.csv``: the check of a fit on another run or machine."""
    rows = _rows(Path(raw_dir) / "grouped_gemm.csv")
    out = {}
    for fam in ("moe_up", "moe_down"):
        f, b, t = _family(rows, fam)
        if not len(t):
            continue
        c, ef, em = (profile[f"linear.{fam}.{k}"] for k in ("launch_s", "flop_eff", "mem_eff"))
        out[fam] = _err(roofline_time(f, b, profile.bf16_flops, profile.hbm_bandwidth, c, ef, em), t)
    return out


def carried_errors(rows, shape, profile) -> dict | None:
    """Relative errors of the cost model's table pricing (the nearest measured table, carried by roofline ratios
    and interpolated in n, as granisim.costmodel.tables prices a step) on GEMM timings at one per-GPU shape;
    None without a linear table."""
    if profile.linear_table is None:
        return None
    ns, ops, ref = nearest_linear_table(profile, shape)
    ns = np.asarray(ns, float)
    pred, t = [], []
    rows = list(rows)
    if not any(x["family"] in TABLE_COLUMN for x in rows):
        return None
    for x in (x for x in rows if x["family"] in TABLE_COLUMN):
        col = carried_s(ops[TABLE_COLUMN[x["family"]]], x["family"], ns, ref, shape, profile.bf16_flops,
                        profile.hbm_bandwidth)
        pred.append(float(table_interp(float(x["n"]), ns, col)))
        t.append(float(x["median_us"]) * 1e-6)
    return _err(pred, t)


def shard_errors(raw_dir: Path, profile) -> dict:
    """Relative errors on the per-shard GEMM timings, by tp: of the profile's linear families (``roofline``), of
    its table pricing (``table``, :func:`carried_errors`) and of the rows themselves at sizes left out."""
    rows = _rows(Path(raw_dir) / "linear_tp.csv")
    model = get_model(json.loads((Path(raw_dir) / "meta.json").read_text())["model"])
    out = {}
    for tp in sorted({int(x["tp"]) for x in rows}):
        mine = [x for x in rows if int(x["tp"]) == tp]
        roof = [float(roofline_time(float(x["flops"]), float(x["bytes"]), profile.bf16_flops, profile.hbm_bandwidth,
                                    *(profile[f"linear.{x['family']}.{k}"] for k in ("launch_s", "flop_eff", "mem_eff"))))
                for x in mine]
        table = carried_errors(mine, model.shard(tp), profile)
        out[tp] = {"roofline": _err(roof, [float(x["median_us"]) * 1e-6 for x in mine]),
                   **({"table": table} if table else {}), "rows held out": _err(*_left_out(mine))}
    return out


def _left_out(rows) -> tuple[list, list]:
    """(interpolated, measured) of each family's interior sizes, each left out in turn and interpolated from
    its neighbours as the cost model reads a table: a per-shard table's error at sizes it did not measure."""
    by: dict[str, list] = {}
    for x in rows:
        by.setdefault(x["family"], []).append((float(x["n"]), float(x["median_us"])))
    pred, t = [], []
    for pts in by.values():
        pts.sort()
        for i in range(1, len(pts) - 1):
            (n0, t0), (n, ti), (n1, t1) = pts[i - 1], pts[i], pts[i + 1]
            pred.append(t0 + (t1 - t0) * (n - n0) / (n1 - n0))
            t.append(ti)
    return pred, t


def write(profile_path: Path, raw_dir: Path, values: dict) -> None:
    """Put the fitted grouped-GEMM coefficients into a profile file as measured."""
    meta = json.loads((Path(raw_dir) / "meta.json").read_text())
    src = measured_source(meta)
    write_coefficients(profile_path, {k: {"value": float(v), "unit": "s" if k.endswith("launch_s") else "",
                                          "source": src} for k, v in values.items()})
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
        for fam, e in profile_errors(raw, prof).items():
            print(f"grouped GEMM {fam}, {prof.name}'s coefficients as they stand, every row: relative error median "
                  f"{e['median']:.1%}, p90 {e['p90']:.1%} ({e['n']} rows)")
        if a.write:
            write(Path(a.profile), raw, values)
            print(f"wrote {a.profile}")
    if (raw / "linear_tp.csv").exists():
        for tp, by in shard_errors(raw, prof).items():
            for how, e in by.items():
                print(f"per-shard GEMMs tp={tp}, {prof.name} {how}: relative error median {e['median']:.1%}, "
                      f"p90 {e['p90']:.1%} ({e['n']} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
