"""Raw calibration data (the CSVs of ``python -m calibration.measure``) and synthetic stand-ins.

A raw directory holds ``meta.json`` and ``linear.csv``, ``attention.csv``, ``overhead.csv``
(columns: calibration.measure). :func:`synthetic_raw` writes the same files from a profile's
coefficients through the cost model itself, for fit tests that must recover known values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import numpy as np
import pandas as pd

from granisim.costmodel import CostTables, op_work
from granisim.config.hardware import (COEFFICIENTS, KERNEL_TABLE_COLS, OPTIONAL_COEFFICIENTS, Coefficient, HardwareProfile,
                               KernelTable, ProfileError, Source)
from granisim.config.models import ModelShape, get_model
from granisim.config.files import one_line

FILES = ("meta.json", "linear.csv", "attention.csv", "overhead.csv")
# raw storage name -> (cost-model storage, page size)
STORAGE = {"slab": ("slab", 1), "slots": ("paged", 1), "pages16": ("paged", 16)}


@dataclass
class Raw:
    meta: dict
    linear: pd.DataFrame
    attention: pd.DataFrame
    overhead: pd.DataFrame
    path: Path | None = None


def measured_source(meta: dict, command: str | None = None, note: str | None = None) -> dict:
    """A profile entry's ``measured`` source from a calibration run's meta.json (``command``: default the run's)."""
    versions = ", ".join(f"{k} {meta.get(k.lower())}" for k in ("torch", "triton", "CUDA", "python"))
    s = {"kind": "measured", "date": meta.get("date", "?"), "command": command or meta.get("command", "?"),
         "gpu": meta.get("gpu", "?"), "commit": str(meta.get("commit", "?")), "versions": versions}
    return {**s, "note": note} if note else s


def read_meta(path: Path) -> dict:
    """A raw directory's meta.json; a ProfileError (one line) where it is missing, unreadable or not an object."""
    f = Path(path) / "meta.json"
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"{f}: field (file): value 'meta.json': cannot read ({e})") from None
    if not isinstance(meta, dict):
        raise ProfileError(f"{f}: field (top): value {type(meta).__name__}: not a JSON object")
    return meta


# The columns the fits and checks read of each file (python -m calibration.measure writes these and more): numbers
# but for TEXT_COLUMNS, empty where a point has none. OPTIONAL_NUMBERS are read where a file has them.
ATTENTION_COLUMNS = ("family", "storage", "G", "B", "L", "M_eff", "n_req", "q_len", "T", "median_us")
COLUMNS = {"linear": ("op", "family", "n", "median_us"), "attention": ATTENTION_COLUMNS,
           "overhead": ("what", "B", "median_us")}
TEXT_COLUMNS = frozenset({"op", "family", "storage", "what"})
OPTIONAL_NUMBERS = ("bytes", "flops")


def read_csv(f: Path, need: tuple[str, ...] = ("median_us",)) -> pd.DataFrame:
    """A calibration CSV; a ProfileError (one line) where it is unreadable, has a row with more fields than its
    header, lacks a column of ``need``, or holds a value in one of them that is not a finite number (empty cells
    are points not measured) or, in ``median_us``, a time that is not > 0."""
    try:
        df = pd.read_csv(f)
    except (OSError, ValueError) as e:  # pandas' EmptyDataError and ParserError are ValueErrors
        raise ProfileError(f"{f}: field (file): value {f.name!r}: cannot read ({one_line(e, None)})") from None
    for col in need:
        if col not in df.columns:
            raise ProfileError(f"{f}: field {col}: value (missing): not a calibration CSV")
    for col in [c for c in (*need, *OPTIONAL_NUMBERS) if c in df.columns and c not in TEXT_COLUMNS]:
        values = pd.to_numeric(df[col], errors="coerce")
        wrong = (df[col].notna() & ~np.isfinite(values)) | ((values <= 0) if col == "median_us" else False)
        if wrong.any():
            i = int(wrong.to_numpy().argmax())
            v = df[col].iloc[i]
            v = v.item() if hasattr(v, "item") else v  # a numpy scalar printed as the number it is
            what = "not a time in microseconds (a finite number > 0)" if col == "median_us" else "not a finite number"
            raise ProfileError(f"{f}: field {col}: value {v!r} (row {i + 1}): {what}")
    if "median_us" in df.columns:
        df["median_us"] = pd.to_numeric(df["median_us"], errors="coerce")
    return df


def load_raw(path: str | Path) -> Raw:
    """Read a raw directory; a missing or unreadable file raises ProfileError (one line)."""
    path = Path(path)
    if not path.is_dir():
        raise ProfileError(f"{path}: field (raw dir): value {str(path)!r}: not a directory")
    meta = read_meta(path)
    frames = {}
    for name in ("linear", "attention", "overhead"):
        f = path / f"{name}.csv"
        df = read_csv(f, COLUMNS[name])
        frames[name] = df[pd.to_numeric(df["median_us"], errors="coerce") > 0].reset_index(drop=True)
        if frames[name].empty:
            raise ProfileError(f"{f}: field median_us: value (no row > 0): no measured rows")
    return Raw(meta, frames["linear"], frames["attention"], frames["overhead"], path)


def holdout(n: int, frac: float = 0.2, seed: int = 0) -> np.ndarray:
    """Boolean mask of the held-out rows: round(frac * n) rows drawn with a seeded generator."""
    mask = np.zeros(n, bool)
    k = int(round(frac * n))
    if n >= 2 and k:
        mask[np.random.default_rng(seed).permutation(n)[:k]] = True
    return mask


# ---- profiles from plain values ----------------------------------------------------------------
def unit_of(name: str) -> str:
    if name in COEFFICIENTS:
        return COEFFICIENTS[name][0]
    return OPTIONAL_COEFFICIENTS[name][0]


_FIT_SOURCE = Source("measured", date="(fit)", command="(fit)")


_LAST_COEF: dict[str, Coefficient] = {}  # per name, the last one built (a fit changes a few values per call)


def _coef(k: str, v) -> Coefficient:
    c = _LAST_COEF.get(k)
    v = float(v)
    if c is None or c.value != v:
        c = _LAST_COEF[k] = Coefficient(v, unit_of(k), _FIT_SOURCE)
    return c


def profile_of(values: dict, name: str = "fit", gpu: str = "fit", table=None) -> HardwareProfile:
    """An in-memory profile with these coefficient values (no linear table; ``table``: a KernelTable)."""
    coefs = {k: _coef(k, v) for k, v in values.items()}
    return HardwareProfile(name, gpu, MappingProxyType(coefs), kernel_table=table)


def kernel_table_of(df: pd.DataFrame, model: ModelShape, source: Source = _FIT_SOURCE, path=None) -> KernelTable:
    """A KernelTable from attention.csv rows (in memory)."""
    cols = {}
    for c in KERNEL_TABLE_COLS:
        v = df[c] if c in df.columns else pd.Series([0.0] * len(df))
        cols[c] = tuple(v.fillna("").astype(str)) if c in ("family", "storage") else \
            tuple(pd.to_numeric(v, errors="coerce").fillna(0.0).astype(float))
    return KernelTable(path, MappingProxyType(model.table_shape()), source, MappingProxyType(cols))


@lru_cache(maxsize=64)
def layer_model(model: ModelShape, G: int) -> ModelShape:
    """One layer of ``model`` with G query heads per KV head (per-layer times, other group sizes)."""
    return replace(model, num_layers=1, n_q_heads=model.n_kv_heads * int(G))


# ---- the cost model's prediction of each raw row (seconds, one layer) ---------------------------
def _lengths(text) -> tuple[int, ...]:
    """'2048;1024' -> (2048, 1024); empty (NaN, '') -> ()."""
    if not isinstance(text, str) or not text:
        return ()
    return tuple(int(x) for x in text.split(";"))


def prepare_rows(df: pd.DataFrame) -> list:
    """The attention rows grouped for :func:`predict_attention` (numpy arrays; group once, predict often)."""
    st = df["storage"].fillna("").astype(str)
    groups = []
    for (fam, G, s), idx in df.assign(_st=st).groupby(["family", "G", "_st"], sort=False).indices.items():
        sub = df.iloc[idx]
        col = {c: sub[c].to_numpy(float) for c in ("B", "L", "M_eff", "q_len", "n_req", "T") if c in sub.columns}
        for c in ("n_splits", "chunk"):  # what each measured launch ran (calibration.measure records them)
            if c in sub.columns:
                col[c] = pd.to_numeric(sub[c], errors="coerce").to_numpy(float)
        if "q_lens" in sub.columns:  # ragged prefill rows (extend_ragged.csv): each request's chunk tokens
            col["q_lens"] = [_lengths(v) for v in sub["q_lens"]]
        groups.append((fam, int(G), s, idx, col))
    return [len(df), groups]


def predict_attention(values: dict, df, model: ModelShape, table=None) -> np.ndarray:
    """Per-row seconds of the attention / KV rows (family column) under ``values`` (attn.form 2),
    with the measured correction of ``table`` (a KernelTable) when given. ``df``: a DataFrame or
    :func:`prepare_rows` of one. A decode / cascade / dense row with recorded ``n_splits`` (and ``chunk``)
    is priced with the splits its launch ran, not with today's split rule (which may have changed since)."""
    n, groups = prepare_rows(df) if isinstance(df, pd.DataFrame) else df
    prof = profile_of(values, table=table)
    out = np.full(n, np.nan)
    tabs = {}
    for fam, G, s, idx, col in groups:
        t = tabs.get(G)
        if t is None:
            t = tabs[G] = CostTables(prof, layer_model(model, G))
        t._priv_class = s if s in ("slots", "pages16") else "slots"
        B, Lk = col["B"], col["L"]
        ran_n, ran_c = col.get("n_splits"), col.get("chunk")
        if fam == "decode":
            inv = 1.0 / t.storage_eff(*STORAGE[s])
            tok = B * Lk
            qo = B * 2.0 * t.n_q * t.d * t.b
            out[idx] = t.decode_time2(tok, B, Lk, tok * t.kvb * inv + qo, gather=s != "slab",
                                      raw_bytes=tok * t.kvb + qo, splits=None if ran_n is None else (ran_n, ran_c))
        elif fam in ("cascade", "dense"):
            res = np.empty(len(idx))
            for lk in np.unique(Lk):
                j = Lk == lk
                ran = None if ran_n is None else (ran_n[j], None if ran_c is None else ran_c[j])
                res[j] = t.prefix_time_array(fam, int(lk), col["M_eff"][j], *STORAGE[s], splits=ran)
            out[idx] = res
        elif fam == "extend":
            out[idx] = t.prefill_time_uniform(col["q_len"], Lk, col["n_req"], t.prefill_inv_eff(*STORAGE[s]))
            for j, qls in enumerate(col.get("q_lens", ())):
                if qls:  # a launch of unequal chunks, priced as the simulator prices a step's prefills
                    reqs = [SimpleNamespace(num_new=q, context_len=int(Lk[j]), shared_len=0, group=-1) for q in qls]
                    out[idx[j]] = t.prefill_time(reqs, t.prefill_inv_eff(*STORAGE[s]), [])
        elif fam == "merge":
            out[idx] = [t.merge_time2(int(T) * t.n_q) for T in col["T"]]
        elif fam == "kv_write":
            out[idx] = [t.kv_write_time2(int(T)) for T in col["T"]]
        elif fam == "kv_copy":
            out[idx] = col["T"] * t.copy_tok + t.copy_launch
    return out


def predict_linear(values: dict, df: pd.DataFrame, model: ModelShape) -> np.ndarray:
    """Per-row seconds of linear.csv rows by the roofline families (no table)."""
    prof = profile_of(values)
    P, BW = prof.bf16_flops, prof.hbm_bandwidth
    out = np.empty(len(df))
    for fam, idx in df.groupby("family").indices.items():
        n = df["n"].to_numpy(float)[idx]
        f, by = op_work(fam, n, model)
        ef = prof[f"linear.{fam}.flop_eff"] if f"linear.{fam}.flop_eff" in COEFFICIENTS else 1.0
        out[idx] = prof[f"linear.{fam}.launch_s"] + np.maximum(f / (P * ef), by / (BW * prof[f"linear.{fam}.mem_eff"]))
    return out


# ---- synthetic raw data ------------------------------------------------------------------------
def synthetic_grid(small: bool = True) -> pd.DataFrame:
    """The attention grid of calibration.measure (a subset when ``small``)."""
    rows = []
    dec_L = [16, 256, 4096, 16384] if small else [16, 64, 256, 1024, 4096, 16384]
    pre_L = [1024, 4096, 16384] if small else [1024, 4096, 16384, 32768]
    pre_B = [1, 4, 16, 64, 128, 256, 512, 1024] if small else \
        [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    for st in STORAGE:
        for Lk in dec_L:
            for B in (1, 4, 16, 64, 256):
                rows.append(dict(family="decode", storage=st, G=4, B=B, L=Lk, M_eff=4, n_req=B, q_len=1, T=B))
    for path in ("cascade", "dense"):
        for Lk in pre_L:
            for B in pre_B:
                rows.append(dict(family=path, storage="slab", G=4, B=B, L=Lk, M_eff=4 * B, n_req=B, q_len=1, T=B))
    for st in ("slots", "pages16"):
        for Lk in pre_L:
            for B in (1, 16, 256):
                rows.append(dict(family="cascade", storage=st, G=4, B=B, L=Lk, M_eff=4 * B, n_req=B, q_len=1, T=B))
    for st in STORAGE:
        for c in (0, 1024, 16384):
            for q in (16, 512, 2048):
                for nr in (1, 4):
                    rows.append(dict(family="extend", storage=st, G=4, B=nr, L=c, M_eff=4 * q, n_req=nr, q_len=q,
                                     T=nr * q))
    for fam in ("merge", "kv_write", "kv_copy"):
        for T in (1, 16, 256, 4096, 16384):
            rows.append(dict(family=fam, storage="slots", G=4, B=T, L=0, M_eff=0, n_req=T, q_len=1, T=T))
    return pd.DataFrame(rows)


LINEAR_OPS = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "mlp_up": "mlp_up_proj",
              "mlp_down": "mlp_down_proj", "lm_head": "lm_head", "norm": "input_layernorm", "mlp_act": "mlp_act",
              "rope": "attn_rope", "add": "add", "embedding": "emb"}


def synthetic_raw(values: dict, out: str | Path, *, model: str = "llama-3.1-8b", noise: float = 0.0,
                  seed: int = 0, small: bool = True) -> Path:
    """Write a raw directory whose timings are the cost model's predictions under ``values``
    (times a log-normal noise of relative sigma ``noise``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    m = get_model(model)
    rng = np.random.default_rng(seed)
    att = synthetic_grid(small)
    t = predict_attention(values, att, m) * np.exp(noise * rng.standard_normal(len(att)))
    att["median_us"], att["p10_us"], att["p90_us"] = t * 1e6, t * 0.98e6, t * 1.02e6
    att.to_csv(out / "attention.csv", index=False)
    ns = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    lin = pd.DataFrame([dict(op=op, family=fam, n=n) for fam, op in LINEAR_OPS.items() for n in ns])
    tl = predict_linear(values, lin, m) * np.exp(noise * rng.standard_normal(len(lin)))
    lin["median_us"], lin["p10_us"], lin["p90_us"] = tl * 1e6, tl * 0.98e6, tl * 1.02e6
    lin.to_csv(out / "linear.csv", index=False)
    step = values["overhead.step_s"] * 1e6
    pd.DataFrame([dict(what="graph_step_wall", B=1, median_us=1000.0 + step * 0.8),
                  dict(what="graph_step_events", B=1, median_us=1000.0),
                  dict(what="eager_step_wall", B=1, median_us=8000.0),
                  dict(what="metadata_host", B=64, median_us=step * 0.2)]).to_csv(out / "overhead.csv", index=False)
    meta = {"date": "2000-01-01T00:00:00+00:00", "commit": "synthetic", "command": "synthetic_raw", "model": model,
            "gpu": "synthetic GPU", "sms": int(values["sm_count"]), "torch": "-", "triton": "-", "cuda": "-",
            "gpu_mem_bytes": values["memory_bytes"], "smoke": False,
            "ceilings": {"copy_Bps": values["hbm_bandwidth"], "gemm_flops": values["bf16_flops"]}}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return out


def hbm_ceiling(raw: Raw) -> tuple[float, str]:
    """The fastest HBM stream of the run: the copy ceiling (bytes read + written) or the fastest
    KV-streaming attention row (bytes read / time), whichever is larger. (A copy captured in a CUDA
    graph runs on the copy engines, below what the SMs stream: the H200 run read 2.76 TB/s there.)"""
    a = raw.attention
    bw = (a["bytes"] / (a["median_us"] * 1e-6)) if "bytes" in a.columns and len(a) else pd.Series([0.0])
    i = bw.idxmax()
    copy = float((raw.meta.get("ceilings") or {}).get("copy_Bps") or 0.0)
    if copy >= bw[i]:
        return copy, f"device-to-device copy {copy / 1e12:.2f} TB/s (bytes read + written)"
    r = a.loc[i]
    return float(bw[i]), (f"fastest KV stream of the run: {r.family} over {r.storage}, B={int(r.B)}, L={int(r.L)}: "
                          f"{bw[i] / 1e12:.2f} TB/s read (the copy ceiling read {copy / 1e12:.2f} TB/s)")
