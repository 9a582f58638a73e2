"""A linear table measured at another model's shapes, added to a profile's ``more_linear_tables``.

    granisim calibrate table RAW_DIR --profile PROFILE.json [--table-dir DIR]

RAW_DIR is a ``python -m calibration.measure --model MODEL --only linear`` output (``linear.csv``,
``meta.json``). Its rows become a Vidur-format table as the full fit makes them (granisim.calibration.fit_linear:
host-bound rows carry the roofline's time), written as ``<gpu>_<model>_linear_ops.csv`` (``--gpu`` of the measurement) in DIR (default:
beside the profile), and the profile gets (or has replaced) the entry for that model's shape, marked measured.
A model of that shape is then priced from this table as measured; other models from the nearest table
(granisim.costmodel.tables.nearest_linear_table). Prints the table's held-out interpolation error.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from granisim.config.hardware import load_profile
from granisim.config.models import get_model

from .fit_linear import fit_linear, vidur_table
from .raw import Raw


def linear_table(raw_dir: Path, profile_path: Path) -> tuple[pd.DataFrame, dict, dict]:
    """(Vidur-format table, held-out errors, the run's meta) of a linear-only calibration run."""
    raw_dir = Path(raw_dir)
    for f in ("meta.json", "linear.csv"):
        if not (raw_dir / f).is_file():
            raise ValueError(f"{raw_dir / f}: no such file (python -m calibration.measure --only linear writes it)")
    meta = json.loads((raw_dir / "meta.json").read_text())
    lin = pd.read_csv(raw_dir / "linear.csv")
    lin = lin[pd.to_numeric(lin["median_us"], errors="coerce") > 0].reset_index(drop=True)
    if lin.empty:
        raise ValueError(f"{raw_dir / 'linear.csv'}: no timed rows")
    prof = load_profile(profile_path)
    raw = Raw(meta, lin, pd.DataFrame(), pd.DataFrame(), raw_dir)
    model = get_model(meta.get("model", "?"))
    _, rows, errors = fit_linear(raw, {"bf16_flops": prof.bf16_flops, "hbm_bandwidth": prof.hbm_bandwidth}, model)
    return vidur_table(rows[rows["family"] != "lm_head"]), errors, meta


def add_table(raw_dir: Path, profile_path: Path, table_dir: Path | None = None) -> tuple[Path, dict]:
    """Write the table and its entry into the profile; (the CSV written, the held-out errors)."""
    profile_path = Path(profile_path)
    table, errors, meta = linear_table(raw_dir, profile_path)
    doc = json.loads(profile_path.read_text())
    model = get_model(meta["model"])
    csv = Path(table_dir or profile_path.parent) / f"{meta.get('gpu_flag') or doc['name']}_{model.name}_linear_ops.csv"
    table.to_csv(csv, index=False, float_format="%.6g")
    versions = f"torch {meta.get('torch')}, triton {meta.get('triton')}, CUDA {meta.get('cuda')}, python {meta.get('python')}"
    entry = {"file": csv.name, "model": model.table_shape(),
             "scaling": "used as measured for this shape; the nearest table carries other shapes by roofline ratios",
             "source": {"kind": "measured", "date": meta.get("date", "?"), "command": meta.get("command", "?"),
                        "gpu": meta.get("gpu", "?"), "commit": str(meta.get("commit", "?")), "versions": versions,
                        "note": f"torch ops at {model.name} shapes over 1..16K tokens, CUDA-graph medians"}}
    more = [t for t in doc.get("more_linear_tables", []) if t["model"] != entry["model"]]
    doc["more_linear_tables"] = more + [entry]
    profile_path.write_text(json.dumps(doc, indent=2) + "\n")
    load_profile(profile_path)
    return csv, errors
