"""A linear table measured at another model's shapes, added to a profile's ``more_linear_tables``.

    granisim calibrate table RAW_DIR --profile PROFILE.json [--table-dir DIR]

RAW_DIR is a ``python -m calibration.measure --model MODEL --only linear`` output (``linear.csv``, ``meta.json``).
Its rows become a Vidur-format table as the full fit makes them (granisim.calibration.fit_linear: host-bound rows
carry the roofline's time), written as ``<gpu>_<model>_linear_ops.csv`` (``--gpu`` of the measurement) in DIR
(default: beside the profile), and the profile gets (or has replaced) that file's entry, marked measured. The
profile is rewritten only once the new one loads. A model of that shape is then priced from this table as
measured; other models from the nearest table (granisim.costmodel.tables.nearest_linear_table). Prints the
table's error at sizes left out and that of the profile's pricing of the same GEMMs without it.

A ``--only linear_tp`` run (``linear_tp.csv``: the GEMMs at the per-GPU shard shapes of tp = 2, 4, 8) becomes
``<gpu>_<model>_shard_linear_ops.csv``, a table of per-tp rows (``num_tensor_parallel_workers`` = tp, no tp = 1
rows): its four GEMM columns as measured, its element-wise columns (not timed by that section) carried to the shard shape from the
profile's primary ``linear_table`` by roofline ratios, as the cost model would price them anyway.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.config.hardware import load_profile, profile_json, write_checked
from granisim.config.models import get_model, measured_shape
from granisim.costmodel.operators import LAYER_OPS, STEP_OPS
from granisim.costmodel.tables import carried_s

from .fit_linear import fit_linear, table_interp, vidur_table
from .moe_fit import carried_errors, shard_errors
from .raw import Raw, measured_source, read_csv, read_meta


def linear_table(raw_dir: Path, prof, model) -> tuple[pd.DataFrame, dict]:
    """(Vidur-format table, held-out errors) of a linear-only calibration run."""
    if not (raw_dir / "linear.csv").is_file():
        raise ValueError(f"{raw_dir / 'linear.csv'}: no such file (python -m calibration.measure --only linear writes it)")
    lin = read_csv(raw_dir / "linear.csv", ("median_us", "op", "family", "n"))
    lin = lin[pd.to_numeric(lin["median_us"], errors="coerce") > 0].reset_index(drop=True)
    if lin.empty:
        raise ValueError(f"{raw_dir / 'linear.csv'}: no timed rows")
    raw = Raw({}, lin, pd.DataFrame(), pd.DataFrame(), raw_dir)
    _, rows, errors = fit_linear(raw, {"bf16_flops": prof.bf16_flops, "hbm_bandwidth": prof.hbm_bandwidth}, model)
    return vidur_table(rows[rows["family"] != "lm_head"]), errors


def shard_table(raw_dir: Path, prof, model) -> tuple[pd.DataFrame, dict]:
    """(Vidur-format table of per-tp rows, held-out errors by tp) of a linear_tp run."""
    rows = read_csv(raw_dir / "linear_tp.csv", ("median_us", "tp", "n", "op"))
    rows = rows[pd.to_numeric(rows["median_us"], errors="coerce") > 0]
    if rows.empty:
        raise ValueError(f"{raw_dir / 'linear_tp.csv'}: no timed rows")
    # the element-wise columns from the primary table, whatever else the profile holds (reproducible)
    primary = prof.linear_table
    ref_ns, ref = np.asarray(primary.num_tokens, float), measured_shape(primary.model, "linear table")
    out = []
    for tp, g in rows.groupby("tp"):
        shard = model.shard(int(tp))
        piv = g.pivot_table(index="n", columns="op", values="median_us", aggfunc="median").dropna() * 1e-3
        t = pd.DataFrame({"num_tokens": piv.index.astype(int), "num_tensor_parallel_workers": int(tp)})
        for fam, col, _ in LAYER_OPS + STEP_OPS:
            if col in piv.columns:
                t[f"time_stats.{col}.median"] = piv[col].to_numpy()
            elif f"time_stats.{col}.median" not in t:
                carried = carried_s(primary.ops_ms[col], fam, ref_ns, ref, shard, prof.bf16_flops, prof.hbm_bandwidth)
                t[f"time_stats.{col}.median"] = table_interp(piv.index.to_numpy(float), ref_ns, carried) * 1e3
        out.append(t)
    return pd.concat(out, ignore_index=True), shard_errors(raw_dir, prof)


def add_table(raw_dir: Path, profile_path: Path, table_dir: Path | None = None) -> tuple[Path, dict]:
    """Write the table and its entry into the profile; (the CSV written, label -> relative errors)."""
    profile_path, raw_dir = Path(profile_path), Path(raw_dir)
    if not (raw_dir / "meta.json").is_file():
        raise ValueError(f"{raw_dir / 'meta.json'}: no such file (python -m calibration.measure writes it)")
    meta = read_meta(raw_dir)
    model, prof = get_model(meta.get("model", "?")), load_profile(profile_path)
    shards = (raw_dir / "linear_tp.csv").is_file() and not (raw_dir / "linear.csv").is_file()
    table, errors = (shard_table if shards else linear_table)(raw_dir, prof, model)
    doc = json.loads(profile_path.read_text())
    kind = "shard_linear_ops" if shards else "linear_ops"
    csv = Path(table_dir or profile_path.parent) / f"{meta.get('gpu_flag') or doc['name']}_{model.name}_{kind}.csv"
    table.to_csv(csv, index=False, float_format="%.6g")
    what = (f"GEMMs at {model.name}'s per-GPU shard shapes of tp {', '.join(str(t) for t in sorted(errors))}, "
            "element-wise columns carried from the linear_table by roofline ratios" if shards else
            f"torch ops at {model.name} shapes over 1..16K tokens")
    entry = {"file": csv.name, "model": model.table_shape(),
             "scaling": "used as measured for this shape; the nearest table carries other shapes by roofline ratios",
             "source": measured_source(meta, note=f"{what}, CUDA-graph medians")}
    report = _report(raw_dir, prof, csv.name, errors, model, shards)
    # a profile made from another (config/profile_base.py) keeps its base's tables beside the new one
    tables = profile_json(profile_path).get("more_linear_tables", [])
    doc["more_linear_tables"] = [t for t in tables if Path(t["file"]).name != csv.name] + [entry]
    write_checked(profile_path, doc)
    return csv, report


SIZE_BINS = ((1, 48), (64, 256), (320, 1536), (2048, 16384))  # the measured grid's sizes, by regime


def _report(raw_dir: Path, prof, name: str, errors: dict, model, shards: bool) -> dict[str, dict]:
    """Label -> relative errors (median, p90, n): the new table at sizes left out, and the profile's pricing of
    the same GEMMs from its other tables (what this table replaces)."""
    others = replace(prof, more_linear_tables=tuple(t for t in prof.more_linear_tables if t.path.name != name))
    if not shards:
        rows = pd.read_csv(raw_dir / "linear.csv").to_dict("records")
        out = {"held out, interpolated": errors["linear(table)"]["heldout"],
               "GEMMs priced from the other tables": carried_errors(rows, model, others)}
        for lo, hi in SIZE_BINS:
            out[f"  of which {lo}-{hi} tokens"] = carried_errors([x for x in rows if lo <= x["n"] <= hi], model, others)
        return out
    rows = pd.read_csv(raw_dir / "linear_tp.csv").to_dict("records")
    out = {}
    for tp, by in errors.items():
        out[f"tp {tp}, held out, interpolated"] = by["rows held out"]
        out[f"tp {tp}, GEMMs priced from the other tables"] = carried_errors(
            [x for x in rows if int(x["tp"]) == tp], model.shard(tp), others)
    return out
