"""Hardware profiles: the cost model's coefficients, each with where it came from.

A profile is a JSON file (shipped ones live in ``granisim/config/profiles/``)::

    {
      "schema": "granikv-hardware-profile/1",
      "name": "a100-80gb",
      "gpu": "NVIDIA A100-SXM4-80GB",
      "notes": "free text",
      "linear_table": {                      # optional: measured linear-operator times
        "file": "vidur_a100_llama3_8b_linear_ops.csv",
        "model": {"hidden": 4096, "n_q_heads": 32, "n_kv_heads": 8, "head_dim": 128,
                  "intermediate": 14336, "vocab": 128256, "dtype_bytes": 2},
        "scaling": "how times are carried to other model shapes",
        "source": {"kind": "published", "citation": "..."}
      },
      "more_linear_tables": [...],           # optional: tables as above measured at other model shapes;
                                             # a model is priced from the table nearest its shape
      "coefficients": {
        "hbm_bandwidth": {"value": 2.039e12, "unit": "B/s",
                          "source": {"kind": "published", "citation": "NVIDIA A100 datasheet"}},
        ...
      }
    }

A profile may be made from another (``"base"``: granisim.config.profile_base) and hold only what it changes.

Every coefficient in :data:`COEFFICIENTS` must be present; those in :data:`OPTIONAL_COEFFICIENTS` may
be (``attn.form = 2`` needs all of them); nothing else. A coefficient's ``source`` is one of

* ``{"kind": "measured", "date": ..., "command": ...}`` (+ optional gpu, commit, versions, note)
* ``{"kind": "published", "citation": ...}`` (+ optional note)
* ``{"kind": "extrapolated", "from": ..., "how": ...}`` (+ optional note)

Values are finite and within each coefficient's rule; a rate (``B/s``, ``FLOP/s``) is at least
:data:`MIN_RATE`. A bad file raises :class:`ProfileError` with one line naming the file, the field and the value.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from granisim.config import profile_base
from granisim.config.files import unreadable
from granisim.config.coefficients import (COEFFICIENTS, FORM2_COEFFICIENTS, KERNEL_FAMILIES, KERNEL_TABLE_COLS,
                                   KERNEL_TABLE_OPTIONAL, OPTIONAL_COEFFICIENTS, Coefficient, HardwareProfile,
                                   KernelTable, LinearTable, ProfileError, Source, StepClasses)
from granisim.config.models import TABLE_SHAPE_KEYS, table_dtype_error
from granisim.config.profile_schema import ExtrapolatedSource, ProfileModel, PublishedSource

# granisim.config.hardware is the profiles' public module: the catalogue and data classes are importable from here too
__all__ = ["COEFFICIENTS", "OPTIONAL_COEFFICIENTS", "FORM2_COEFFICIENTS", "KERNEL_TABLE_COLS", "KERNEL_FAMILIES",
           "SCHEMA", "PROFILE_DIR", "DATA_DIR", "ProfileError", "Source", "Coefficient", "LinearTable", "KernelTable",
           "HardwareProfile", "load_profile", "profile_json", "write_coefficients", "write_checked", "available_profiles",
           "get_profile"]

SCHEMA = "granikv-hardware-profile/1"
PROFILE_DIR = Path(__file__).with_name("profiles")
DATA_DIR = Path(__file__).with_name("data")

# the file's shapes and types: granisim.config.profile_schema (pydantic); ranges, names and tables: checked below
_TABLE_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
              "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def _fail(file: Path | str, field: str, value: Any, why: str) -> ProfileError:
    v = repr(value)
    if len(v) > 80:
        v = v[:77] + "..."
    return ProfileError(f"{file}: field {field}: value {v}: {why}")


def _lookup(data: Any, loc: tuple) -> Any:
    for k in loc:
        try:
            data = data[k]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _source(m: BaseModel) -> Source:
    if isinstance(m, PublishedSource):
        return Source("published", citation=m.citation, note=m.note)
    if isinstance(m, ExtrapolatedSource):
        return Source("extrapolated", from_=m.from_, how=m.how, note=m.note)
    extra = {k: getattr(m, k) for k in ("gpu", "commit", "versions") if getattr(m, k)}
    return Source("measured", date=m.date, command=m.command, note=m.note, extra=MappingProxyType(extra))


MIN_RATE = 1e6  # a bandwidth (B/s) or compute rate (FLOP/s) below it prices a step past any simulated clock


def _check_value(file: Path | str, name: str, value: float, rule: str, unit: str = "") -> None:
    field = f"coefficients.{name}.value"
    if isinstance(value, bool) or not math.isfinite(value):
        raise _fail(file, field, value, "must be a finite number")
    if rule == "pos" and value <= 0:
        raise _fail(file, field, value, "must be > 0")
    if unit in ("B/s", "FLOP/s") and value < MIN_RATE:
        raise _fail(file, field, value, f"a rate below {MIN_RATE:g} {unit} (the slowest GPU or link moves "
                                        f"gigabytes a second)")
    if rule == "nonneg" and value < 0:
        raise _fail(file, field, value, "must be >= 0")
    if rule == "frac" and not 0 < value <= 1:
        raise _fail(file, field, value, "must be in (0, 1]")
    if rule == "share" and not 0 <= value <= 1:
        raise _fail(file, field, value, "must be in [0, 1]")
    if rule == "int" and (value < 1 or value != int(value)):
        raise _fail(file, field, value, "must be an integer >= 1")


def _read_table(file: Path | str, path: Path, field: str,
                allow_none: bool = False) -> tuple[tuple[int, ...], dict[str, tuple[float, ...]]]:
    """TP=1 medians, duplicates of num_tokens averaged, sorted by num_tokens (none at all: only with allow_none)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise _fail(file, field, str(path), unreadable(e)) from None
    acc: dict[int, list[list[float]]] = {}
    try:
        for i, row in enumerate(rows, 1):
            if int(row.get("num_tensor_parallel_workers", 1)) != 1:
                continue
            vals = [_cell(file, field, path, i, row, f"time_stats.{op}.median") for op in _TABLE_OPS]
            n = _cell(file, field, path, i, row, "num_tokens", positive=True)
            if n != int(n):
                raise _fail(file, field, str(path), f"row {i}, column num_tokens = {n!r}: must be an integer >= 1")
            acc.setdefault(int(n), []).append(vals)
    except (KeyError, ValueError) as e:
        if isinstance(e, ProfileError):
            raise
        raise _fail(file, field, str(path), f"bad table column or value ({e})") from None
    if len(acc) < 2 and not (allow_none and not acc):
        raise _fail(file, field, str(path), "needs at least two num_tokens rows")
    ns = tuple(sorted(acc))
    ops = {op: tuple(sum(v[i] for v in acc[n]) / len(acc[n]) for n in ns) for i, op in enumerate(_TABLE_OPS)}
    return ns, ops


def _read_tp_tables(file: Path | str, path: Path, field: str) -> Mapping[int, tuple]:
    """The table's TP > 1 rows (Vidur's per-shard timings), by tp: (num_tokens, ops_ms) as :func:`_read_table`."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    acc: dict[int, dict[int, list[list[float]]]] = {}
    try:
        for i, row in enumerate(rows, 1):
            tp = int(row.get("num_tensor_parallel_workers", 1))
            if tp == 1:
                continue
            vals = [_cell(file, field, path, i, row, f"time_stats.{op}.median") for op in _TABLE_OPS]
            n = _cell(file, field, path, i, row, "num_tokens", positive=True)
            acc.setdefault(tp, {}).setdefault(int(n), []).append(vals)
    except (KeyError, ValueError) as e:
        if isinstance(e, ProfileError):
            raise
        raise _fail(file, field, str(path), f"bad table column or value ({e})") from None
    out = {}
    for tp, by_n in acc.items():
        ns = tuple(sorted(by_n))
        out[tp] = (ns, MappingProxyType({op: tuple(sum(v[i] for v in by_n[n]) / len(by_n[n]) for n in ns)
                                         for i, op in enumerate(_TABLE_OPS)}))
    return MappingProxyType(out)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{path}: field (file): value {str(path)!r}: {unreadable(e, 'no such profile file')}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: field (file): value line {e.lineno} col {e.colno}: invalid JSON ({e.msg})") from None


def profile_json(path: str | Path) -> dict:
    """A profile file's JSON with its base's fields filled in (config/profile_base.py), not yet validated."""
    path = Path(path)
    return profile_base.resolve(path, _read_json(path), PROFILE_DIR, _fail)


def write_coefficients(path: str | Path, entries: Mapping[str, dict]) -> None:
    """Set coefficients (``{name: {"value", "unit", "source"}}``) in the profile file at ``path``, as its own: in a
    profile made from another they go on top of the base's (config/profile_base.py). Checked like
    :func:`write_checked`: a bad entry leaves the file as it was."""
    path = Path(path)
    doc = _read_json(path)
    doc.setdefault("coefficients", {}).update(entries)
    write_checked(path, doc)


def write_checked(path: str | Path, doc: dict) -> None:
    """Write ``doc`` as the profile file ``path`` if it loads: checked in a file beside it first, so a bad document
    leaves the profile as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    try:
        load_profile(tmp)
    except ValueError as err:  # named as the file it would have become
        tmp.unlink()
        raise ProfileError(str(err).replace(str(tmp), str(path))) from None
    tmp.replace(path)


def load_profile(path: str | Path) -> HardwareProfile:
    """Read and validate one profile file."""
    path = Path(path)
    raw = _read_json(path)
    base = profile_base.reference(raw)
    raw = profile_base.resolve(path, raw, PROFILE_DIR, _fail)  # a profile made from another: its base filled in
    try:
        m = ProfileModel.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x in ("measured", "published", "extrapolated")))
        field = ".".join(str(x) for x in loc) or "(top)"
        value = err.get("input") if err["type"] != "missing" else "(missing)"
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            field += ".kind"
            value = err.get("ctx", {}).get("tag", "(missing)")
        raise _fail(path, field, value, err["msg"]) from None

    names = set(m.coefficients)
    for name in COEFFICIENTS:
        if name not in names:
            raise _fail(path, f"coefficients.{name}", "(missing)", "required coefficient missing")
    for name in m.coefficients:
        if name not in COEFFICIENTS and name not in OPTIONAL_COEFFICIENTS:
            raise _fail(path, f"coefficients.{name}", name, "unknown coefficient")
    form = m.coefficients.get("attn.form")
    if form is not None:
        if form.value not in (1, 2):
            raise _fail(path, "coefficients.attn.form.value", form.value, "must be 1 or 2")
        if form.value == 2:
            for name in FORM2_COEFFICIENTS:
                if name not in names:
                    raise _fail(path, f"coefficients.{name}", "(missing)", "required when attn.form = 2")
    coefs: dict[str, Coefficient] = {}
    rules = {**COEFFICIENTS, **{k: v[:2] for k, v in OPTIONAL_COEFFICIENTS.items()}}
    for name, (unit, rule) in rules.items():
        c = m.coefficients.get(name)
        if c is None:
            continue
        _check_value(path, name, c.value, rule, unit)
        if c.unit != unit:
            raise _fail(path, f"coefficients.{name}.unit", c.unit, f"must be {unit!r}")
        coefs[name] = Coefficient(float(c.value), unit, _source(c.source))

    table = _linear_table(path, "linear_table", m.linear_table) if m.linear_table is not None else None
    if m.more_linear_tables and table is None:
        raise _fail(path, "more_linear_tables", len(m.more_linear_tables), "needs a linear_table beside it")
    more = tuple(_linear_table(path, f"more_linear_tables.{i}", t, shards_only=True)
                 for i, t in enumerate(m.more_linear_tables))
    ktable = None
    if m.kernel_table is not None:
        t = m.kernel_table
        if coefs.get("attn.form") is None or coefs["attn.form"].value != 2:
            raise _fail(path, "kernel_table", t.file, "needs coefficients.attn.form = 2")
        tpath = _table_file(path, "kernel_table", t)
        ktable = KernelTable(tpath, MappingProxyType(dict(t.model)), _source(t.source), _read_kernel_table(path, tpath))
    classes = _step_classes(path, m.step_classes) if m.step_classes is not None else None
    return HardwareProfile(m.name, m.gpu, MappingProxyType(coefs), table, m.notes, path, ktable, more, classes, base)


STEP_CLASS_RANGE = (0.5, 2.0)  # a factor outside it is a fit gone wrong, not an engine


def _step_classes(path: Path, sc) -> StepClasses:
    """The step-class factors, each model known, each policy a validation policy, each class one the cost model
    prices (granisim/costmodel/step_classes.py) and each factor within STEP_CLASS_RANGE."""
    from granisim.config.models import MODELS
    from granisim.costmodel.step_classes import CLASSES, POLICY_KEY

    lo, hi = STEP_CLASS_RANGE
    out = {}
    for model, by_policy in sc.factors.items():
        if model not in MODELS:
            raise _fail(path, f"step_classes.factors.{model}", model, f"unknown model; known: {', '.join(MODELS)}")
        for policy, factors in by_policy.items():
            where = f"step_classes.factors.{model}.{policy}"
            if not POLICY_KEY.fullmatch(policy):
                raise _fail(path, where, policy, "not a policy: granikv, token or paged<page size>, e.g. paged16")
            for cls, f in factors.items():
                if cls not in CLASSES:
                    raise _fail(path, f"{where}.{cls}", cls, "unknown class of step, e.g. 'decode 1-4' or "
                                                             "'prefill >2048 x2 fresh'")
                if not (math.isfinite(f) and lo <= f <= hi):
                    raise _fail(path, f"{where}.{cls}", f, f"must be a factor within {lo}..{hi}")
        out[model] = MappingProxyType({p: MappingProxyType(dict(f)) for p, f in by_policy.items()})
    return StepClasses(MappingProxyType(out), _source(sc.source))


def _linear_table(path: Path, field: str, t, shards_only: bool = False) -> LinearTable:
    """A linear table; with ``shards_only`` (more_linear_tables) it may hold tp > 1 rows alone."""
    tpath = _table_file(path, field, t)
    ns, ops = _read_table(path, tpath, f"{field}.file", allow_none=shards_only)
    tp_ops = _read_tp_tables(path, tpath, f"{field}.file")
    if not ns and not tp_ops:
        raise _fail(path, f"{field}.file", str(tpath), "needs at least two num_tokens rows")
    return LinearTable(tpath, MappingProxyType(dict(t.model)), t.scaling, _source(t.source), ns,
                       MappingProxyType(ops), tp_ops)


def _table_file(path: Path, field: str, t) -> Path:
    """Check a table's model shape and find its CSV (next to the profile, then in granisim/config/data)."""
    for k in TABLE_SHAPE_KEYS:
        if k not in t.model:
            raise _fail(path, f"{field}.model.{k}", "(missing)", "required")
        if t.model[k] < 1:
            raise _fail(path, f"{field}.model.{k}", t.model[k], "must be >= 1")
    why = table_dtype_error(t.model["dtype_bytes"])
    if why:
        raise _fail(path, f"{field}.model.dtype_bytes", t.model["dtype_bytes"], why)
    tpath = next((p for p in (path.parent / t.file, DATA_DIR / t.file) if p.is_file()), None)
    if tpath is None:
        raise _fail(path, f"{field}.file", t.file, f"not found next to the profile or in {DATA_DIR}")
    return tpath


def _cell(file: Path | str, field: str, path: Path, i: int, row: dict, col: str, positive: bool = False) -> float:
    """A table cell as a finite number >= 0 (> 0 with ``positive``), or a ProfileError naming row and column."""
    v = float(row[col])
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise _fail(file, field, str(path), f"row {i}, column {col} = {row[col]!r}: must be a finite number "
                                            f"{'> 0' if positive else '>= 0'}")
    return v


def _read_kernel_table(file: Path | str, path: Path) -> Mapping[str, tuple]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise _fail(file, "kernel_table.file", str(path), unreadable(e)) from None
    cols: dict[str, list] = {c: [] for c in KERNEL_TABLE_COLS}
    try:
        for i, row in enumerate(rows, 1):
            if row["family"] not in KERNEL_FAMILIES:
                continue
            for c in KERNEL_TABLE_COLS:
                v = row.get(c) if c in KERNEL_TABLE_OPTIONAL else row[c]
                if c not in ("family", "storage") and v and not math.isfinite(float(v)):
                    raise _fail(file, "kernel_table.file", str(path), f"row {i}, column {c} = {v!r}: must be a "
                                                                      f"finite number")
                cols[c].append(v if c in ("family", "storage") else float(v or 0.0))
    except (KeyError, ValueError) as e:
        if isinstance(e, ProfileError):
            raise
        raise _fail(file, "kernel_table.file", str(path), f"bad table column or value ({e})") from None
    if not cols["family"] or min(cols["median_us"]) <= 0:
        raise _fail(file, "kernel_table.file", str(path), "needs rows with positive median_us")
    return MappingProxyType({c: tuple(v) for c, v in cols.items()})


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def has_engine_corrections(profile: HardwareProfile) -> bool:
    """Does ``profile`` hold the real engine's corrections to its microbenchmarked prices (``engine.*``)?"""
    return any(k.startswith("engine.") for k in profile.coefficients)


def profiles_table() -> str:
    """The shipped profiles, one line each: GPU, the profile it is made from, its coefficients' sources by kind,
    whether it holds the real engine's corrections, and the models its step-class factors cover."""
    rows = [("profile", "GPU", "made from", "coefficients", "engine corrections", "step classes")]
    for name in available_profiles():
        p = get_profile(name)
        kinds = Counter(c.source.kind for c in p.coefficients.values())
        rows.append((name, p.gpu, p.base or "-", ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
                     "yes" if has_engine_corrections(p) else "-",
                     ", ".join(sorted(p.step_classes.factors)) if p.step_classes else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def with_values(profile: HardwareProfile, values: Mapping[str, float], where: str = "--set") -> HardwareProfile:
    """``profile`` with some coefficients set by hand (a what-if), each checked against its rule like a profile
    file's; their source says they were set, from which profile. A bad name or value is a ProfileError naming
    ``where``."""
    rules = {**COEFFICIENTS, **{k: v[:2] for k, v in OPTIONAL_COEFFICIENTS.items()}}
    coefs = dict(profile.coefficients)
    for name, value in values.items():
        if name not in rules:
            raise _fail(where, name, value, "unknown coefficient (granisim profile show PROFILE lists them)")
        unit, rule = rules[name]
        _check_value(where, name, value, rule, unit)
        coefs[name] = Coefficient(float(value), unit, Source("extrapolated", from_=f"profile {profile.name}",
                                                             how=f"set by hand ({where})"))
    return replace(profile, coefficients=MappingProxyType(coefs))


@lru_cache(maxsize=None)
def _loaded(path: str, _stamp) -> HardwareProfile:
    return load_profile(path)


def _cached(path: str) -> HardwareProfile:
    """``path`` loaded once per version of the file (its modification time and size): a profile edited
    in between is read again."""
    try:
        st = Path(path).stat()
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None  # load_profile says what is wrong
    return _loaded(path, stamp)


def get_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by name (``a100-80gb``, ``h100-sxm``, ``h200``, ``b200``) or a JSON file path.

    Loaded once per resolved path and version of the file, and cached (the same object is returned on later
    calls while the file is unchanged).
    """
    s = str(name_or_path)
    p = Path(s)
    if s.endswith(".json") or p.is_file() or p.parent != Path("."):
        return _cached(str(p.resolve()))
    shipped = PROFILE_DIR / f"{s}.json"
    if not shipped.is_file():
        raise ProfileError(f"{s}: field profile: value {s!r}: unknown profile; known: "
                           f"{', '.join(available_profiles())} (or give a path to a .json file)")
    return _cached(str(shipped.resolve()))
