"""How much slower a skewed decode batch streams its KV, from the split-balance microbenchmark
(``python3 -m gpu_backend.bench.split_balance --out DIR``), into a profile as ``attn.decode.skew_stream``.

The benchmark times one decode launch over B requests' own suffixes, lengths drawn from the bundled Azure trace
(``suffix B=...`` rows; granikv's suffix pass), with the splits cut at several caps. Where the longest suffix
exceeds ``attn.cascade.balance_skew`` x the mean and the launch is split, the programs hold chunks of very mixed
lengths, and the kernel streams the KV they share the bandwidth for more slowly than a batch of equal lengths
(on the H200 at 2.6-3.1 TB/s against 4.2-4.4). The factor is the one value of the cost model's shared-stream
factor for such batches that prices these launches best: the smallest median |log(predicted / measured)| over
the rows at the caps the engine's rule can choose (``attn.cascade.balance_chunk`` tokens or more), on a grid of
0.005; equal-length rows are not affected by it.

    granisim calibrate skew SPLIT_BALANCE.json --profile PROFILE.json [--date D] [--commit C] [--versions V]
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import numpy as np

from granisim.config.hardware import load_profile, write_coefficients
from granisim.config.models import get_model
from granisim.costmodel import split_rule
from granisim.costmodel.tables import CostTables

NAME = "attn.decode.skew_stream"
ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-3.1-8b"  # the benchmark's heads (32 query, 8 KV, d 128, bf16)
GRID = np.round(np.arange(0.5, 3.0001, 0.005), 3)
CASE = re.compile(r"suffix B=(\d+) L_p=0 max=(\d+)$")
CAP = re.compile(r"cap_(.+)_us$")


def trace_lengths(n: int, seed: int) -> np.ndarray:
    """``n`` suffix lengths drawn from the bundled Azure trace (the benchmark's batches: seed = its --seed + n)."""
    from granisim.core.workload import load_trace

    lens = load_trace()["num_prefill_tokens"].to_numpy()
    return np.random.default_rng(seed).choice(lens, n).astype(np.int64)


def _fail(path: Path, field: str, value, why: str) -> ValueError:
    return ValueError(f"{path}: field {field}: value {value!r}: {why}")


def points(path: Path, tables: CostTables, seed: int = 0) -> list[dict]:
    """The benchmark's skewed, split suffix launches: per (case, cap) the lengths, split count, chunk and time."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"{path}: cannot read it ({err.strerror})") from None
    try:
        rows = json.loads(text)["rows"]
    except (ValueError, KeyError, TypeError) as err:
        raise _fail(path, "rows", None, f"not a split_balance.json ({err})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise _fail(path, "rows", type(rows).__name__, "not a list of objects (a split_balance.json)")
    out = []
    for row in rows:
        m = CASE.match(str(row.get("case", "")))
        if not m:
            continue
        B, longest = int(m[1]), int(m[2])
        lens = trace_lengths(B, seed + B)
        if int(lens.max()) != longest:
            raise _fail(path, "case", row["case"], f"the trace's lengths at seed {seed + B} have longest "
                        f"{int(lens.max())}: another trace or --seed ran")
        mean = math.ceil(lens.mean())
        for key, us in row.items():
            c = CAP.match(key)
            if not c or not isinstance(us, (int, float)) or us <= 0:
                continue
            cap = _cap(c[1], longest, mean, tables)
            if cap is None or cap < tables.balance_chunk:
                continue  # no cap, or one the engine's rule never chooses
            n, chunk = tables.split_rule(tables.n_kv * B, longest, 64.0, gather=True, cap=cap)
            if n > 1 and longest > tables.balance_skew * mean:
                out.append({"case": row["case"], "cap": c[1], "B": B, "tokens": int(lens.sum()), "longest": longest,
                            "n_splits": int(n), "chunk": int(chunk), "measured_us": float(us)})
    if not out:
        raise _fail(path, "rows", len(rows), "no skewed suffix launch split at a cap of balance_chunk or more")
    return out


def _cap(name: str, longest: int, mean: int, t: CostTables) -> float | None:
    """The cap a benchmark column cut its splits at (None: no cap)."""
    if name == "none":
        return None
    if name == "mean":
        return float(max(t.balance_chunk, mean))
    if name == "2xmean":
        return float(max(t.balance_chunk, 2 * mean))
    if name == "shipped":
        return float(split_rule.balance_cap(longest, mean, balance_chunk=t.balance_chunk,
                                            balance_skew=t.balance_skew)) or None
    return float(name) if name.isdigit() else None


def priced_us(pts: list[dict], t: CostTables, factor: float) -> np.ndarray:
    """One layer's decode launch time (us) of each point, its shared stream ``factor`` x slower (the factor is
    left set on ``t``)."""
    t.skew_stream = factor
    col = {k: np.array([float(p[k]) for p in pts]) for k in ("B", "tokens", "longest", "n_splits", "chunk")}
    B, tok = col["B"], col["tokens"]
    qo = B * 2.0 * t.n_q * t.d * t.b
    inv = 1.0 / t.storage_eff("paged", 1)  # slot lists
    s = t.decode_time2(tok, B, col["longest"], tok * t.kvb * inv + qo, gather=True, raw_bytes=tok * t.kvb + qo,
                       splits=(col["n_splits"], col["chunk"]))
    return np.asarray(s, float) / t.layers * 1e6


def fit(path: Path, profile) -> tuple[float, dict]:
    """(factor, its errors before and after) for ``profile`` (a HardwareProfile) from the benchmark's JSON."""
    t = CostTables(profile, get_model(MODEL))
    pts = points(path, t)
    meas = np.array([p["measured_us"] for p in pts])
    score = [float(np.median(np.abs(np.log(priced_us(pts, t, f) / meas)))) for f in GRID]
    best = float(GRID[int(np.argmin(score))])
    err = {f: priced_us(pts, t, f) / meas - 1.0 for f in (1.0, best)}
    return best, {"points": len(pts), **{f"at_{f:g}": {"median": float(np.median(e)), "min": float(e.min()),
                                                         "max": float(e.max())} for f, e in err.items()}}


def add_to_file(path: Path, profile_path: Path, date: str | None = None, commit: str | None = None,
                versions: str | None = None) -> dict:
    """Write the factor into the profile file (checked before it replaces it); returns the entry. ``date``,
    ``commit`` and ``versions`` default to the run's own fields."""
    profile_path, path = Path(profile_path), Path(path)
    profile = load_profile(profile_path)
    value, e = fit(path, profile)  # says what is wrong with the file, if anything
    run = json.loads(path.read_text())
    if run.get("device") and run["device"] != profile.gpu:
        raise _fail(path, "device", run["device"], f"the benchmark ran on another GPU than {profile_path} describes "
                    f"({profile.gpu})")
    shown = path.relative_to(ROOT) if path.is_absolute() and path.is_relative_to(ROOT) else path
    before, after = e["at_1"], e[f"at_{value:g}"]
    note = (f"fitted (granisim/calibration/skew.py) on {e['points']} skewed, split suffix launches of the "
            f"split-balance benchmark ({shown}); priced with factor 1 their error was median {before['median']:+.1%} "
            f"({before['min']:+.1%}..{before['max']:+.1%}), with {value:g} median {after['median']:+.1%} "
            f"({after['min']:+.1%}..{after['max']:+.1%})")
    given = "".join(f" --{k} {shlex.quote(v)}" for k, v in (("date", date), ("commit", commit), ("versions", versions))
                    if v)  # what the run's JSON lacked: the command as it reruns
    source = {"kind": "measured", "gpu": run.get("device", "unknown"),
              "command": f"python3 -m gpu_backend.bench.split_balance --out DIR; granisim calibrate skew {shown} "
                         f"--profile {profile_path.name}{given}", "note": note}
    date = date or run.get("date")
    if not date:
        raise _fail(path, "date", None, "the run's JSON does not say when it ran: give --date")
    versions = versions or ", ".join(f"{k} {run[k]}" for k in ("torch", "triton") if run.get(k))
    for key, v in (("date", date), ("commit", commit or run.get("commit")), ("versions", versions)):
        if v:
            source[key] = v
    entry = {"value": value, "unit": "", "source": source}
    write_coefficients(profile_path, {NAME: entry})
    return entry

