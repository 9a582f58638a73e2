"""A profile's attention pricing against microbenchmark rows it was not fitted on.

    granisim calibrate check RAW_DIR --profile PROFILE [--family extend]

RAW_DIR is a ``python -m calibration.measure`` output: its ``attention.csv`` and, when present,
``extend_shapes.csv`` and ``extend_ragged.csv`` (prefill launches of unequal chunks, priced request by request
as the simulator prices a step's prefills). Every row (decode, cascade, dense, extend, merge, KV write, KV copy) is priced by
the cost model with the profile's coefficients and measured kernel table, at the row's own group size
``G`` (query heads per KV head), and compared with its measured median. The error is signed,
(predicted - measured) / measured: negative means the profile prices the kernel faster than it ran.
Rows of the slot-listed storages that the fit has no class for (``slotrun``, ``shared_slotrun``,
``shared_slots``: the engine lists a slab or a shared prefix slot by slot) are priced as ``slots``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from granisim.config.hardware import get_profile
from granisim.config.models import get_model

from .raw import ATTENTION_COLUMNS, STORAGE, predict_attention, read_csv

FILES = ("attention.csv", "extend_shapes.csv", "extend_ragged.csv")
FAMILIES = ("decode", "cascade", "dense", "extend", "merge", "kv_write", "kv_copy")


def priced_rows(raw_dir: Path, profile: str, family: str | None = None) -> pd.DataFrame:
    """Every timed attention row of ``raw_dir`` with ``predicted_us`` and signed ``error`` columns (and
    ``file``: which CSV it came from)."""
    frames = []
    for name in FILES:
        f = raw_dir / name
        if f.is_file():
            frames.append(read_csv(f, ATTENTION_COLUMNS).assign(file=name))
    if not frames:
        raise ValueError(f"{raw_dir}: no {' or '.join(FILES)} (python -m calibration.measure --out DIR writes them)")
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[rows["family"].isin(FAMILIES) & (pd.to_numeric(rows["median_us"], errors="coerce") > 0)]
    if family is not None:
        if family not in FAMILIES:
            raise ValueError(f"--family: value {family!r}: expected one of {', '.join(FAMILIES)}")
        rows = rows[rows["family"] == family]
    if rows.empty:
        raise ValueError(f"{raw_dir}: no timed rows" + (f" of family {family!r}" if family else ""))
    rows = rows.reset_index(drop=True)
    rows["measured_storage"] = rows["storage"]
    rows["storage"] = rows["storage"].where(rows["storage"].isin(list(STORAGE)) | rows["family"].isin(
        ("merge", "kv_write", "kv_copy")), "slots")
    prof = get_profile(profile)
    values = {k: c.value for k, c in prof.coefficients.items()}
    form = int(values.get("attn.form", 1))
    if form != 2:  # predict_attention prices rows with the kernels' own (form-2) formulas only
        raise ValueError(f"--profile {profile}: attn.form = {form}: calibrate check prices rows with the kernels' "
                         f"form-2 formulas; use a measured profile (h200, h200-engine, h100-sxm, b200 or a fitted one)")
    # the row's group size is its own; the rest of the shape (KV heads, head size) is the measured model's
    model = get_model(_model_of(raw_dir))
    pred = predict_attention(values, rows, model, table=prof.kernel_table)
    rows["predicted_us"] = pred * 1e6
    rows["error"] = rows["predicted_us"] / rows["median_us"] - 1.0
    return rows


def _model_of(raw_dir: Path) -> str:
    import json

    meta = raw_dir / "meta.json"
    try:
        return json.loads(meta.read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{meta}: field model: unreadable or missing (the measurement's meta.json names its model)")


def error_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per family, measured storage and G: rows, median and p90 of |error|, median signed error."""
    g = rows.assign(abs_error=rows["error"].abs()).groupby(["family", "measured_storage", "G"], sort=True)
    return pd.DataFrame({"rows": g.size(), "median_abs": g["abs_error"].median(),
                         "p90_abs": g["abs_error"].quantile(0.9), "median_signed": g["error"].median()}).reset_index()


def format_table(table: pd.DataFrame) -> str:
    out = ["| family | storage | G | rows | median abs | p90 abs | median signed |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in table.itertuples(index=False):
        out.append(f"| {r.family} | {r.measured_storage} | {r.G} | {r.rows} | {r.median_abs:.1%} | {r.p90_abs:.1%} | "
                   f"{r.median_signed:+.1%} |")
    return "\n".join(out)


def overall(rows: pd.DataFrame) -> dict:
    e = rows["error"].to_numpy(float)
    return {"rows": int(e.size), "median_abs": float(np.median(np.abs(e))),
            "p90_abs": float(np.quantile(np.abs(e), 0.9)), "median_signed": float(np.median(e))}
