"""The decode kernel's own re-read share of a shared prefix, from ``python -m calibration.measure --only
shared_decode`` (calibration/measure/shared_decode.py), into a profile as ``attn.decode.kernel_reread``.

B requests over k roles each read their role's L-token prefix and s tokens of their own, in one launch, timed beside
the same launch over distinct contexts of the same lengths. Streamed at the distinct launch's rate, the shared launch's
time says what share ``f`` of a first read each of the B - k re-reads cost:
``f = (t_shared / t_distinct * B (L + s) - (k L + B s)) / ((B - k) L)``. The profile's value is the median over every
point with B > k (storages, group sizes, prefix lengths, roles and batches), with p10, p90 and the count in its
source. The cost model does not price it: ``granisim profile carry`` reads it on both GPUs
(granisim/calibration/carry.py).

    granisim calibrate reread RAW_DIR --profile PROFILE.json
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from granisim.config.hardware import write_coefficients

from .raw import measured_source, read_csv, read_meta

NAME = "attn.decode.kernel_reread"
KEY = ["storage", "G", "L", "roles", "B"]


def reread_share(raw: Path) -> pd.DataFrame:
    """Per point of RAW/shared_decode.csv: the two launches' times, their ratio and the re-read share ``f`` it implies
    (NaN where B <= k: no re-read)."""
    df = read_csv(Path(raw) / "shared_decode.csv", need=("family", *KEY, "suffix", "median_us"))
    shared = df[df.family == "decode_shared"].set_index(KEY)
    distinct = df[df.family == "decode_distinct"].set_index(KEY)
    j = shared[["median_us", "suffix"]].join(distinct[["median_us"]].rename(columns={"median_us": "distinct_us"}),
                                             how="inner")
    p = j.index.to_frame(index=False)
    B, k, L, s = p.B.to_numpy(), p.roles.to_numpy(), p.L.to_numpy(), j.suffix.to_numpy()
    ratio = (j.median_us / j.distinct_us).to_numpy()
    f = np.where(B > k, (ratio * B * (L + s) - (k * L + B * s)) / (np.maximum(B - k, 1) * L), np.nan)
    return p.assign(shared_us=j.median_us.to_numpy(), distinct_us=j.distinct_us.to_numpy(), ratio=ratio, f=f)


def kernel_share(raw: Path) -> dict:
    """The profile entry: the median share over the points with a re-read, its spread in the source's note."""
    f = reread_share(raw).f.dropna()
    if f.empty:
        raise ValueError(f"{Path(raw) / 'shared_decode.csv'}: field B: value <= roles everywhere: no point re-reads "
                         "a prefix (python -m calibration.measure --only shared_decode)")
    value = float(f.median())
    if not 0 < value <= 1:
        raise ValueError(f"{Path(raw) / 'shared_decode.csv'}: field median_us: value (shared / distinct) gives a "
                         f"re-read share of {value:.3f}, outside (0, 1]: measure again")
    note = (f"the decode kernel alone: median over {f.size} points (storages, group sizes, prefix lengths, roles, "
            f"batches; p10 {f.quantile(0.1):.3f}, p90 {f.quantile(0.9):.3f}) of what a request's re-read of a prefix "
            "another request of its role reads in the same launch costs, as a share of a first read "
            "(granisim/calibration/reread.py); not priced: granisim profile carry reads it")
    return {"value": round(value, 4), "unit": "", "source": measured_source(read_meta(raw), note=note)}


def add_to_file(raw: Path, profile_path: Path) -> dict:
    """Write the share into the profile file (checked before it replaces it); returns the entry."""
    entry = kernel_share(raw)
    write_coefficients(profile_path, {NAME: entry})
    return entry
