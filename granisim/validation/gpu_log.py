"""Read-only GPU clock and power log during a run: ``nvidia-smi`` sampling every 100 ms into a CSV.

    with GpuLog(out / "gpu_log.csv", enabled=True):
        ...  # the run

Only queries: no clock, power or application setting is ever changed. Where ``nvidia-smi`` is
absent, the log is skipped with a note (the run goes on). :func:`read_gpu_log` parses the CSV
and :func:`log_summary` reduces it to the figures a report quotes (median SM clock, share of
samples at the power cap).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

FIELDS = ("timestamp", "power.draw", "power.limit", "clocks.sm", "clocks.mem", "temperature.gpu",
          "clocks_throttle_reasons.active")
COLUMNS = ("timestamp", "power_w", "power_limit_w", "sm_mhz", "mem_mhz", "temp_c", "throttle")
SW_POWER_CAP = 0x4  # clocks_throttle_reasons.active bit: software power cap (NVML)
HW_SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # hardware slowdown, SW thermal, HW thermal, HW power brake


# newer drivers name the throttle field clocks_event_reasons.active; older ones only the first name
THROTTLE_FIELDS = ("clocks_throttle_reasons.active", "clocks_event_reasons.active")


def nvidia_smi_command(period_ms: int = 100, throttle_field: str = THROTTLE_FIELDS[0]) -> list[str]:
    fields = (*FIELDS[:-1], throttle_field)
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-lms", str(period_ms)]


def _working_command(period_ms: int) -> list[str]:
    """The sampler command with the first throttle-field name this nvidia-smi accepts (one query each)."""
    for name in THROTTLE_FIELDS:
        cmd = nvidia_smi_command(period_ms, name)
        try:
            if subprocess.run(cmd[:-2], capture_output=True, timeout=20).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            break
    return nvidia_smi_command(period_ms)


class GpuLog:
    """Starts the sampler on enter, stops it on exit. ``command`` replaces nvidia-smi (tests)."""

    def __init__(self, path: Path, enabled: bool = True, command: list[str] | None = None, period_ms: int = 100):
        self.path = Path(path)
        self.enabled = enabled
        self.command = command
        self.period_ms = period_ms
        self.proc: subprocess.Popen | None = None
        self.note = ""

    def __enter__(self) -> "GpuLog":
        if not self.enabled:
            return self
        if self.command is None:
            self.command = ["nvidia-smi"] if shutil.which("nvidia-smi") is None else _working_command(self.period_ms)
        if shutil.which(self.command[0]) is None:
            self.note = f"{self.command[0]} not found: no GPU clock/power log"
            print(f"note: {self.note}", file=sys.stderr)
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self.proc = subprocess.Popen(self.command, stdout=self._file, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._file.close()
        self.proc = None


def _throttle(v) -> int:
    v = str(v).strip()
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return 0


def read_gpu_log(path: Path) -> pd.DataFrame:
    """The log as a frame (one row per sample and GPU; columns COLUMNS, numbers as floats, ``time`` as
    datetimes). Lines that are not a complete sample (a sampler stopped mid-line) are dropped;
    "[N/A]" fields become NaN."""
    rows = []
    for line in Path(path).read_text(errors="replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(COLUMNS):
            continue
        rows.append(parts)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["time"] = pd.to_datetime(df.timestamp, format="%Y/%m/%d %H:%M:%S.%f", errors="coerce")
    for c in COLUMNS[1:-1]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df["throttle"] = df.throttle.map(_throttle)
    return df.dropna(subset=["time"]).reset_index(drop=True)


def log_summary(df: pd.DataFrame, start=None, end=None) -> dict:
    """Median / p10 SM clock, median power, and the share of samples at the software power cap (its
    throttle bit set) or with any hardware/thermal slowdown, over [start, end] (datetimes; default all)."""
    if start is not None:
        df = df[df.time >= start]
    if end is not None:
        df = df[df.time <= end]
    if not len(df):
        return {"samples": 0}
    return {"samples": int(len(df)), "sm_mhz_p50": float(df.sm_mhz.median()),
            "sm_mhz_p10": float(np.nanpercentile(df.sm_mhz, 10)), "power_w_p50": float(df.power_w.median()),
            "power_limit_w": float(df.power_limit_w.median()), "temp_c_max": float(df.temp_c.max()),
            "power_capped_share": float(((df.throttle & SW_POWER_CAP) > 0).mean()),
            "hw_slowdown_share": float(((df.throttle & HW_SLOWDOWN) > 0).mean())}
