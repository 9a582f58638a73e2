"""A sweep's results table: one parquet part file per finished point, appended at once.

``OUT/results/part-<point id>.parquet`` holds one row. A part is written to a temporary
name and renamed into place (atomic on POSIX), so a killed sweep leaves only whole parts
behind and loses at most the points in flight; a re-run skips every point whose part
exists. The parts together are the table (:meth:`ResultsStore.read`); the directory can
also be read by any parquet reader as one dataset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from granisim.config.files import one_line

PREFIX, SUFFIX = "part-", ".parquet"


class ResultsStore:
    def __init__(self, out: str | Path):
        self.dir = Path(out) / "results"
        self.dir.mkdir(parents=True, exist_ok=True)

    def done_ids(self) -> set[str]:
        return {p.name[len(PREFIX) : -len(SUFFIX)] for p in self.dir.glob(f"{PREFIX}*{SUFFIX}")}

    def write(self, row: dict) -> Path:
        pid = row["point_id"]
        final = self.dir / f"{PREFIX}{pid}{SUFFIX}"
        tmp = self.dir / f".tmp-{pid}-{os.getpid()}"
        pd.DataFrame([row]).to_parquet(tmp, index=False)
        os.replace(tmp, final)
        return final

    def read(self, ids: list[str] | None = None) -> pd.DataFrame:
        """The table (rows in ``ids`` order when given, else sorted by point id)."""
        parts = sorted(self.dir.glob(f"{PREFIX}*{SUFFIX}"))
        if ids is not None:
            want = {pid: i for i, pid in enumerate(ids)}
            parts = [p for p in parts if p.name[len(PREFIX) : -len(SUFFIX)] in want]
            parts.sort(key=lambda p: want[p.name[len(PREFIX) : -len(SUFFIX)]])
        if not parts:
            return pd.DataFrame()
        frames = [_read_part(p) for p in parts]
        cols = list(dict.fromkeys(c for f in frames for c in f.columns))
        frames = [f.dropna(axis=1, how="all") for f in frames]  # all-null columns carry no type
        return pd.concat(frames, ignore_index=True).reindex(columns=cols)


def _read_part(path: Path) -> pd.DataFrame:
    """One part; a damaged one (not parquet: written by something else, or a disk error) is a ValueError that says
    how to run its point again, not pyarrow's own message."""
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{path}: a damaged results part ({one_line(err)}); delete it and run "
                         f"the sweep again to recompute that point") from None
