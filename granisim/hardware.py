"""Hardware profiles: the cost model's coefficients, each with where it came from.

A profile is a JSON file (shipped ones live in ``granisim/profiles/``)::

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
      "coefficients": {
        "hbm_bandwidth": {"value": 2.039e12, "unit": "B/s",
                          "source": {"kind": "published", "citation": "NVIDIA A100 datasheet"}},
        ...
      }
    }

Every coefficient in :data:`COEFFICIENTS` must be present; those in :data:`OPTIONAL_COEFFICIENTS` may
be (``attn.form = 2`` needs all of them); nothing else. A coefficient's ``source`` is one of

* ``{"kind": "measured", "date": ..., "command": ...}`` (+ optional gpu, commit, versions, note)
* ``{"kind": "published", "citation": ...}`` (+ optional note)
* ``{"kind": "extrapolated", "from": ..., "how": ...}`` (+ optional note)

A bad file raises :class:`ProfileError` with one line naming the file, the field and the value.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA = "granikv-hardware-profile/1"
PROFILE_DIR = Path(__file__).with_name("profiles")
DATA_DIR = Path(__file__).with_name("data")

# name -> (unit, rule). Rules: pos = finite > 0; frac = 0 < x <= 1; int = integer >= 1; nonneg = >= 0.
COEFFICIENTS: dict[str, tuple[str, str]] = {
    # the GPU
    "memory_bytes": ("B", "pos"),
    "hbm_bandwidth": ("B/s", "pos"),
    "bf16_flops": ("FLOP/s", "pos"),
    "sm_count": ("SMs", "int"),
    "m_sat": ("rows", "int"),
    # fixed costs
    "overhead.step_s": ("s", "nonneg"),
    "overhead.kernel_launch_s": ("s", "nonneg"),
    # linear operators: t = launch_s + max(FLOPs / (bf16_flops * flop_eff), bytes / (hbm_bandwidth * mem_eff))
    **{f"linear.{fam}.{k}": (u, r)
       for fam in ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "lm_head")
       for k, u, r in (("launch_s", "s", "nonneg"), ("flop_eff", "", "frac"), ("mem_eff", "", "frac"))},
    # element-wise operators: t = launch_s + bytes / (hbm_bandwidth * mem_eff)
    **{f"linear.{fam}.{k}": (u, r)
       for fam in ("mlp_act", "norm", "rope", "add", "embedding")
       for k, u, r in (("launch_s", "s", "nonneg"), ("mem_eff", "", "frac"))},
    # attention
    "attn.prefill.m_tile": ("rows", "int"),
    "attn.prefill.flop_eff": ("", "frac"),
    "attn.prefill.mem_eff": ("", "frac"),
    "attn.decode.m_tile": ("rows", "int"),
    "attn.decode.flop_eff": ("", "frac"),
    "attn.decode.mem_eff": ("", "frac"),
    "attn.cascade.m_tile": ("rows", "int"),
    "attn.cascade.flop_eff": ("", "frac"),
    "attn.cascade.mem_eff": ("", "frac"),
    "attn.cascade.ctas_per_sm": ("CTAs", "int"),
    "attn.cascade.min_split_tokens": ("tokens", "int"),
    "attn.cascade.launches": ("kernels", "int"),
    "attn.dense.m_tile": ("rows", "int"),
    "attn.dense.flop_eff": ("", "frac"),
    "attn.dense.mem_eff": ("", "frac"),
    "attn.dense.launches": ("kernels", "int"),
    "attn.merge.mem_eff": ("", "frac"),
    # KV movement
    "kv.write_eff": ("", "frac"),
    "kv.copy_eff": ("", "frac"),
    # storage: fraction of the contiguous read rate reached when gathering KV
    "storage.slab_eff": ("", "frac"),
    "storage.page1_eff": ("", "frac"),
    "storage.page16_eff": ("", "frac"),
}


# Optional coefficients: absent means the default (which keeps the first cost-model forms). ``attn.form = 2``
# selects the attention/KV forms fitted to the Triton kernels (granisim/costmodel/) and then needs all of
# FORM2_COEFFICIENTS; name -> (unit, rule, default).
FORM2_DEFAULTS: dict[str, tuple[str, str, float]] = {
    # Form 2 kernel model, per kernel family (attn.prefill/decode/cascade/dense/merge, kv.write_):
    #   launch_s              fixed time per launch (launch, in-graph gap, prologue, epilogue)
    #   program_s             fixed time per program (its first loads' latency, its stores)
    #   sat_ctas_per_sm       programs per SM needed to reach mem_eff (one program streams at most
    #                         hbm_bandwidth * mem_eff / (sm_count * sat_ctas_per_sm))
    #   resident_ctas_per_sm  programs an SM runs at once (programs beyond run in later waves)
    **{f"attn.{p}.{k}": (u, r, d)
       for p in ("prefill", "decode", "cascade", "dense", "merge")
       for k, u, r, d in (("launch_s", "s", "nonneg", 0.0), ("program_s", "s", "nonneg", 0.0),
                          ("sat_ctas_per_sm", "CTAs", "pos", 1.0), ("resident_ctas_per_sm", "CTAs", "int", 1))},
    **{f"kv.write_{k}": (u, r, d)
       for k, u, r, d in (("launch_s", "s", "nonneg", 0.0), ("program_s", "s", "nonneg", 0.0),
                          ("sat_ctas_per_sm", "CTAs", "pos", 1.0), ("resident_ctas_per_sm", "CTAs", "int", 1))},
    "kv.copy_launch_s": ("s", "nonneg", 0.0),
    # the extend kernel's own gather efficiencies (no split along KV: few programs, latency-bound gathers)
    "attn.prefill.page1_eff": ("", "frac", 1.0),
    "attn.prefill.page16_eff": ("", "frac", 1.0),
    "attn.cascade.min_m_tile": ("rows", "int", 16),
    # split-KV over gathered storage (page tables, slot lists) with row tiles <= 64: programs per SM, rounded up
    "attn.cascade.gather_ctas_per_sm": ("CTAs", "int", 1),
    "attn.cascade.max_splits": ("splits", "int", 64),
    "attn.dense.max_splits": ("splits", "int", 1),
}
ENGINE_DEFAULTS: dict[str, tuple[str, str, float]] = {
    # the real engine's in-situ time per breakdown key vs the microbenchmark-fitted model:
    # key time = scale * model time + offset (CUDA-graph gaps, in-graph timing marks), fitted on
    # real-engine runs (granisim.calibration.engine); per request host work of a step's metadata
    # (engine.eager.*: the same for steps of more than graph_max_tokens, which the engine runs eagerly
    # with a launch per operator instead of replaying a CUDA graph; 0 = one set for all steps)
    **{f"engine.{m}{k}.{c}": (u, r, d)
       for m in ("", "eager.")
       for k in ("linear", "lm_head", "attn_prefill", "attn_decode", "attn_prefix", "merge", "kv_write")
       for c, u, r, d in (("scale", "", "pos", 1.0), ("offset_s", "s", "nonneg", 0.0))},
    "engine.graph_max_tokens": ("tokens", "nonneg", 0),
    # decode over a shared prefix that every member of a group re-reads in the same launch (the baselines):
    # the members after the first cost this fraction of a first read (their reads hit L2); 1 = no reuse
    "attn.decode.shared_reread": ("", "frac", 1.0),
    # an eager step launches every operator from the host: its linear part takes at least this long
    "engine.eager.linear_floor_s": ("s", "nonneg", 0.0),
    "overhead.per_request_s": ("s", "nonneg", 0.0),
    "overhead.per_kv_token_s": ("s", "nonneg", 0.0),  # host slot lists: per private KV token a step reads
    "overhead.per_pass_s": ("s", "nonneg", 0.0),  # host metadata of each prefix pass (group maps, storage)
}
# what the microbenchmark calibration fits (calibration/fit.py); the engine ones come from engine runs
KERNEL_MODEL_COEFFICIENTS = {
    "attn.form": ("", "int", 1), **FORM2_DEFAULTS,
    # split-KV load balance: in a batch whose longest sequence exceeds balance_skew x its mean length,
    # no split longer than max(balance_chunk, the mean); balance_chunk 0 = none (kernels before it;
    # optional so that profiles fitted to them stay valid)
    "attn.cascade.balance_chunk": ("tokens", "int", 0),
    "attn.cascade.balance_skew": ("", "pos", 2.0)}
OPTIONAL_COEFFICIENTS = {**KERNEL_MODEL_COEFFICIENTS, **ENGINE_DEFAULTS}
FORM2_COEFFICIENTS = tuple(FORM2_DEFAULTS)


class ProfileError(ValueError):
    """A profile file is missing, unreadable or invalid (one line: file, field, value)."""


# ---- data ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Source:
    kind: str  # 'measured' | 'published' | 'extrapolated'
    citation: str | None = None  # published
    date: str | None = None  # measured
    command: str | None = None  # measured
    from_: str | None = None  # extrapolated: from what
    how: str | None = None  # extrapolated: how
    note: str | None = None
    extra: Mapping[str, str] | None = None  # measured: gpu, commit, versions

    def describe(self) -> str:
        if self.kind == "published":
            s = f"published: {self.citation}"
        elif self.kind == "measured":
            s = f"measured {self.date}: {self.command}"
        else:
            s = f"extrapolated from {self.from_}: {self.how}"
        return s + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True, slots=True)
class Coefficient:
    value: float
    unit: str
    source: Source


@dataclass(frozen=True, slots=True)
class LinearTable:
    """Measured per-operator times (ms, medians) at one model shape, by num_tokens."""

    path: Path
    model: Mapping[str, int]  # hidden, n_q_heads, n_kv_heads, head_dim, intermediate, vocab, dtype_bytes
    scaling: str
    source: Source
    num_tokens: tuple[int, ...]
    ops_ms: Mapping[str, tuple[float, ...]]  # column (e.g. 'mlp_up_proj') -> ms per num_tokens


KERNEL_TABLE_COLS = ("family", "storage", "G", "B", "L", "M_eff", "q_len", "n_req", "T", "median_us")
KERNEL_FAMILIES = ("decode", "cascade", "dense", "extend", "merge", "kv_write")


@dataclass(frozen=True, slots=True)
class KernelTable:
    """Measured per-layer kernel times (calibration/measure.py attention.csv rows) at one model shape.
    With ``attn.form = 2`` the cost model multiplies its formula by the measured / formula ratio,
    interpolated over these points (granisim/costmodel/correction.py ``Correction``)."""

    path: Path | None
    model: Mapping[str, int]
    source: Source
    rows: Mapping[str, tuple]  # column (KERNEL_TABLE_COLS) -> values


@dataclass(frozen=True, slots=True, eq=False)  # identity hash: usable as a cache key
class HardwareProfile:
    name: str
    gpu: str
    coefficients: Mapping[str, Coefficient]
    linear_table: LinearTable | None = None
    notes: str = ""
    path: Path | None = None
    kernel_table: KernelTable | None = None

    def __getitem__(self, name: str) -> float:
        c = self.coefficients.get(name)
        if c is None and name in OPTIONAL_COEFFICIENTS:
            return OPTIONAL_COEFFICIENTS[name][2]
        return self.coefficients[name].value

    @property
    def memory_bytes(self) -> float:
        return self["memory_bytes"]

    @property
    def hbm_bandwidth(self) -> float:
        return self["hbm_bandwidth"]

    @property
    def bf16_flops(self) -> float:
        return self["bf16_flops"]

    @property
    def sm_count(self) -> int:
        return int(self["sm_count"])

    @property
    def m_sat(self) -> int:
        return int(self["m_sat"])

    def describe(self) -> str:
        """The coefficients with their units and sources, one per line."""
        lines = [f"{self.name} ({self.gpu})" + (f" — {self.path}" if self.path else "")]
        w = max(map(len, self.coefficients))
        for k, c in self.coefficients.items():
            lines.append(f"  {k:<{w}}  {c.value:>12.6g} {c.unit:<7} {c.source.describe()}")
        if self.linear_table is not None:
            lt = self.linear_table
            lines.append(f"  linear_table: {lt.path.name} ({len(lt.num_tokens)} token counts) — "
                         f"{lt.source.describe()}; {lt.scaling}")
        if self.kernel_table is not None:
            kt = self.kernel_table
            lines.append(f"  kernel_table: {kt.path.name if kt.path else '(in memory)'} ({len(kt.rows['family'])} "
                         f"kernel timings; form-2 formulas x measured/formula, interpolated) — {kt.source.describe()}")
        return "\n".join(lines)


# ---- validation (pydantic for shapes and types; ranges and names checked below) ---------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Measured(_Strict):
    kind: Literal["measured"]
    date: str = Field(min_length=1)
    command: str = Field(min_length=1)
    gpu: str | None = None
    commit: str | None = None
    versions: str | None = None
    note: str | None = None


class _Published(_Strict):
    kind: Literal["published"]
    citation: str = Field(min_length=1)
    note: str | None = None


class _Extrapolated(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    kind: Literal["extrapolated"]
    from_: str = Field(alias="from", min_length=1)
    how: str = Field(min_length=1)
    note: str | None = None


_SourceModel = Union[_Measured, _Published, _Extrapolated]


class _CoefModel(_Strict):
    value: float
    unit: str
    source: _SourceModel = Field(discriminator="kind")


class _TableModel(_Strict):
    file: str = Field(min_length=1)
    model: dict[str, int]
    scaling: str = Field(min_length=1)
    source: _SourceModel = Field(discriminator="kind")


class _KernelTableModel(_Strict):
    file: str = Field(min_length=1)
    model: dict[str, int]
    source: _SourceModel = Field(discriminator="kind")


class _ProfileModel(_Strict):
    schema_: Literal["granikv-hardware-profile/1"] = Field(alias="schema")
    name: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    notes: str = ""
    linear_table: _TableModel | None = None
    kernel_table: _KernelTableModel | None = None
    coefficients: dict[str, _CoefModel]


_TABLE_MODEL_KEYS = ("hidden", "n_q_heads", "n_kv_heads", "head_dim", "intermediate", "vocab", "dtype_bytes")
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
    if isinstance(m, _Published):
        return Source("published", citation=m.citation, note=m.note)
    if isinstance(m, _Extrapolated):
        return Source("extrapolated", from_=m.from_, how=m.how, note=m.note)
    extra = {k: getattr(m, k) for k in ("gpu", "commit", "versions") if getattr(m, k)}
    return Source("measured", date=m.date, command=m.command, note=m.note, extra=MappingProxyType(extra))


def _check_value(file: Path | str, name: str, value: float, rule: str) -> None:
    field = f"coefficients.{name}.value"
    if isinstance(value, bool) or not math.isfinite(value):
        raise _fail(file, field, value, "must be a finite number")
    if rule == "pos" and value <= 0:
        raise _fail(file, field, value, "must be > 0")
    if rule == "nonneg" and value < 0:
        raise _fail(file, field, value, "must be >= 0")
    if rule == "frac" and not 0 < value <= 1:
        raise _fail(file, field, value, "must be in (0, 1]")
    if rule == "int" and (value < 1 or value != int(value)):
        raise _fail(file, field, value, "must be an integer >= 1")


def _read_table(file: Path | str, path: Path) -> tuple[tuple[int, ...], dict[str, tuple[float, ...]]]:
    """TP=1 medians, duplicates of num_tokens averaged, sorted by num_tokens."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise _fail(file, "linear_table.file", str(path), f"cannot read ({e.strerror})") from None
    acc: dict[int, list[list[float]]] = {}
    try:
        for row in rows:
            if int(row.get("num_tensor_parallel_workers", 1)) != 1:
                continue
            vals = [float(row[f"time_stats.{op}.median"]) for op in _TABLE_OPS]
            acc.setdefault(int(row["num_tokens"]), []).append(vals)
    except (KeyError, ValueError) as e:
        raise _fail(file, "linear_table.file", str(path), f"bad table column or value ({e})") from None
    if len(acc) < 2:
        raise _fail(file, "linear_table.file", str(path), "needs at least two num_tokens rows")
    ns = tuple(sorted(acc))
    ops = {op: tuple(sum(v[i] for v in acc[n]) / len(acc[n]) for n in ns) for i, op in enumerate(_TABLE_OPS)}
    return ns, ops


def load_profile(path: str | Path) -> HardwareProfile:
    """Read and validate one profile file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: field (file): value {str(path)!r}: no such profile file") from None
    except OSError as e:
        raise ProfileError(f"{path}: field (file): value {str(path)!r}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: field (file): value line {e.lineno} col {e.colno}: invalid JSON ({e.msg})") from None
    try:
        m = _ProfileModel.model_validate(raw)
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
        _check_value(path, name, c.value, rule)
        if c.unit != unit:
            raise _fail(path, f"coefficients.{name}.unit", c.unit, f"must be {unit!r}")
        coefs[name] = Coefficient(float(c.value), unit, _source(c.source))

    table = None
    if m.linear_table is not None:
        t = m.linear_table
        tpath = _table_file(path, "linear_table", t)
        ns, ops = _read_table(path, tpath)
        table = LinearTable(tpath, MappingProxyType(dict(t.model)), t.scaling, _source(t.source), ns,
                            MappingProxyType(ops))
    ktable = None
    if m.kernel_table is not None:
        t = m.kernel_table
        if coefs.get("attn.form") is None or coefs["attn.form"].value != 2:
            raise _fail(path, "kernel_table", t.file, "needs coefficients.attn.form = 2")
        tpath = _table_file(path, "kernel_table", t)
        ktable = KernelTable(tpath, MappingProxyType(dict(t.model)), _source(t.source), _read_kernel_table(path, tpath))
    return HardwareProfile(m.name, m.gpu, MappingProxyType(coefs), table, m.notes, path, ktable)


def _table_file(path: Path, field: str, t) -> Path:
    """Check a table's model shape and find its CSV (next to the profile, then in granisim/data)."""
    for k in _TABLE_MODEL_KEYS:
        if k not in t.model:
            raise _fail(path, f"{field}.model.{k}", "(missing)", "required")
        if t.model[k] < 1:
            raise _fail(path, f"{field}.model.{k}", t.model[k], "must be >= 1")
    tpath = next((p for p in (path.parent / t.file, DATA_DIR / t.file) if p.is_file()), None)
    if tpath is None:
        raise _fail(path, f"{field}.file", t.file, f"not found next to the profile or in {DATA_DIR}")
    return tpath


def _read_kernel_table(file: Path | str, path: Path) -> Mapping[str, tuple]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise _fail(file, "kernel_table.file", str(path), f"cannot read ({e.strerror})") from None
    cols: dict[str, list] = {c: [] for c in KERNEL_TABLE_COLS}
    try:
        for row in rows:
            if row["family"] not in KERNEL_FAMILIES:
                continue
            for c in KERNEL_TABLE_COLS:
                v = row[c]
                cols[c].append(v if c in ("family", "storage") else float(v or 0.0))
    except (KeyError, ValueError) as e:
        raise _fail(file, "kernel_table.file", str(path), f"bad table column or value ({e})") from None
    if not cols["family"] or min(cols["median_us"]) <= 0:
        raise _fail(file, "kernel_table.file", str(path), "needs rows with positive median_us")
    return MappingProxyType({c: tuple(v) for c, v in cols.items()})


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


@lru_cache(maxsize=None)
def _cached(path: str) -> HardwareProfile:
    return load_profile(path)


def get_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by name (``a100-80gb``, ``h100-sxm``, ``h200``, ``b200``) or a JSON file path.

    Loaded once per resolved path and cached (the same object is returned on later calls).
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
