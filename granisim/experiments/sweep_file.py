"""Sweep files (TOML): a base scenario and a grid of points over dotted scenario fields.

    name = "k_vs_hot"
    base = "../scenarios/multi_agent_16k.toml"     # a path (relative to this file) ...
    # [base] ... or an inline scenario table
    set = { "workload.num_requests" = 200 }        # fixed overrides of the base (optional)

    [grid]                                         # one cartesian product ...
    "policy.hot_fraction" = [0.1, 0.2, 0.4]
    workload.roles = [4, 16, 64]                   # (nested keys are the same dotted name)

    [[grid]]                                       # ... or several: the sweep is their union
    [[points]]                                     # listed points, each a table of overrides;
    "policy.name" = "token"                        # with a grid, every listed point is
                                                   # combined with every grid point

    [speedup]                                      # optional: the ratio column for plots
    field = "policy.name"                          # which field tells target from baseline
    target = "granikv"
    baseline = "token"
    metric = "throughput_rps"

    [[plot]]                                       # optional: heatmaps and lines
    kind = "heatmap"                               # heatmap | line
    x = "workload.roles"
    y = "policy.hot_fraction"
    value = "speedup"                              # 'speedup' or any results column
    where = { "policy.dispatch" = "cost" }         # optional: only these rows

Every field name and every value is validated through the :class:`Scenario` model (and
:func:`granisim.experiments.run.prepare`) before anything runs: a mistake is a
:class:`ScenarioError` with one line naming the file, the field and the value.

A point is identified by a stable hash of its full resolved scenario (sorted JSON), so a
re-run finds the points it already has whatever the sweep file's order or layout.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from granisim.config.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

POINT_SCHEMA = "granisim-point/1"  # bump when the meaning of a resolved scenario changes
_TOP_KEYS = {"name", "base", "set", "grid", "points", "speedup", "plot", "description"}


@dataclass(frozen=True)
class Point:
    pid: str  # stable hash of the resolved scenario
    overrides: dict  # dotted name -> value, as written (grid + listed point, not `set`)
    scenario: Scenario


@dataclass(frozen=True)
class Speedup:
    field: str = "policy.name"
    target: object = "granikv"
    baseline: object = "token"
    metric: str = "throughput_rps"


@dataclass(frozen=True)
class PlotSpec:
    kind: str  # 'heatmap' | 'line'
    x: str
    y: str | None = None  # heatmap: the second axis; line: one line per value of y (optional)
    value: str = "speedup"
    title: str = ""
    where: dict | None = None  # only rows with these field values, e.g. {"policy.dispatch" = "cost"}


@dataclass(frozen=True)
class SweepSpec:
    name: str
    source: str
    base: Scenario
    points: list[Point]
    varied: list[str]  # dotted fields that any point overrides, in first-seen order
    speedup: Speedup | None = None
    plots: list[PlotSpec] = field(default_factory=list)


@functools.lru_cache(maxsize=64)
def profile_fingerprint(name: str) -> str:
    """Hash of the files a profile name resolves to (its JSON and the tables it references), so
    that a re-measured profile under the same name makes new points instead of reusing old rows."""
    from granisim.config.hardware import get_profile

    try:
        prof = get_profile(name)
    except ValueError:
        return "unresolved"
    h = hashlib.sha256()
    tables = [getattr(prof, "linear_table", None), getattr(prof, "kernel_table", None)]
    for path in [prof.path] + [getattr(t, "path", None) for t in tables if t is not None]:
        if path is not None and Path(path).is_file():
            h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def point_id(scenario: Scenario) -> str:
    """Stable hash of the full resolved scenario: every field, plus the content of the hardware
    profile it names. (Simulator code changes do not change ids: use a new --out after one.)"""
    blob = json.dumps({"schema": POINT_SCHEMA, "scenario": scenario.model_dump(mode="json"),
                       "profile": profile_fingerprint(scenario.hardware.profile)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _flatten(table: dict, where: str, source: str, prefix: str = "") -> dict:
    """{'policy': {'hot_fraction': [..]}} and {'policy.hot_fraction': [..]} -> {'policy.hot_fraction': [..]}."""
    out = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, where, source, name + "."))
        else:
            out[name] = v
    return out


def _apply(data: dict, dotted: dict, source: str, where: str) -> dict:
    """Set dotted fields in a scenario dict; unknown names raise ScenarioError."""
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for key, value in dotted.items():
        target, parts = data, key.split(".")
        schema = Scenario.model_fields
        for p in parts[:-1]:
            f = schema.get(p)
            sub = getattr(f.annotation, "model_fields", None) if f is not None else None
            if sub is None:
                raise ScenarioError(f"{source}: unknown scenario field {key!r} (in {where})")
            target = target.setdefault(p, {})
            schema = sub
        if parts[-1] not in schema or getattr(schema[parts[-1]].annotation, "model_fields", None) is not None:
            raise ScenarioError(f"{source}: unknown scenario field {key!r} (in {where})")
        target[parts[-1]] = value
    return data


def _expand_grid(grid: dict, source: str, where: str) -> list[dict]:
    flat = _flatten(grid, where, source)
    if not flat:
        raise ScenarioError(f"{source}: {where} is empty (give at least one field with a list of values)")
    for k, v in flat.items():
        if not isinstance(v, list):
            raise ScenarioError(f"{source}: field {k} = {v!r} in {where}: a grid value must be a list of values")
        if not v:
            raise ScenarioError(f"{source}: field {k} = [] in {where}: empty list of values (empty grid)")
    keys = list(flat)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(flat[k] for k in keys))]


def _base_data(raw: dict, path: Path, source: str) -> dict:
    base = raw.get("base", {})
    if isinstance(base, str):
        p = Path(base)
        if not p.is_absolute():
            p = path.parent / p
        try:
            return load_scenario(p).model_dump(mode="json")
        except ScenarioError as err:
            raise ScenarioError(f"{source}: field base = {base!r}: {err}") from None
    if isinstance(base, dict):
        return parse_scenario(base, source=f"{source} [base]").model_dump(mode="json")
    raise ScenarioError(f"{source}: field base = {base!r}: give a scenario path or an inline [base] table")


def _check_value(base: dict, key: str, value, source: str, where: str) -> Scenario:
    data = _apply(base, {key: value}, source, where)
    try:
        return parse_scenario(data, source=source)
    except ScenarioError as err:
        raise ScenarioError(f"{err} (in {where})") from None


def load_sweep(path: str | Path, check_setup: bool = True) -> SweepSpec:
    """Parse and validate a sweep file; every point's scenario is resolved here."""
    path = Path(path)
    source = str(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as err:
        raise ScenarioError(f"{source}: cannot read sweep file ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"{source}: not valid TOML ({err})") from None
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise ScenarioError(f"{source}: unknown sweep key {unknown[0]!r} (use {', '.join(sorted(_TOP_KEYS))})")
    return sweep_from_dict(raw, source, path, check_setup)


def sweep_from_dict(raw: dict, source: str = "<sweep>", path: Path | None = None,
                    check_setup: bool = True) -> SweepSpec:
    path = path or Path(".") / "sweep.toml"
    base = _base_data(raw, path, source)
    fixed = raw.get("set", {})
    if not isinstance(fixed, dict):
        raise ScenarioError(f"{source}: field set = {fixed!r}: give a table of dotted overrides")
    fixed = _flatten(fixed, "set", source)
    for k, v in fixed.items():
        _check_value(base, k, v, source, "set")
    base = _apply(base, fixed, source, "set")
    base_sc = parse_scenario(base, source=source)

    grids = raw.get("grid")
    if isinstance(grids, dict):
        grids = [grids]
    if grids is not None and not isinstance(grids, list):
        raise ScenarioError(f"{source}: field grid = {grids!r}: give a [grid] table or [[grid]] tables")
    listed = raw.get("points")
    if listed is not None and (not isinstance(listed, list) or not all(isinstance(p, dict) for p in listed)):
        raise ScenarioError(f"{source}: field points = {listed!r}: give [[points]] tables of dotted overrides")
    if not grids and not listed:
        raise ScenarioError(f"{source}: empty grid: no [grid] and no [[points]] (nothing to run)")
    combos: list[dict] = []
    for i, g in enumerate(grids or []):
        combos.extend(_expand_grid(g, source, "grid" if len(grids) == 1 else f"grid #{i + 1}"))
    extra = [_flatten(p, "points", source) for p in (listed or [])]
    if listed is not None and not listed:
        raise ScenarioError(f"{source}: points = []: empty list of points (empty grid)")
    if combos and extra:
        combos = [{**c, **e} for e in extra for c in combos]
    elif extra:
        combos = extra

    # every distinct (field, value) checked alone first: the error names the culprit
    seen: set[tuple[str, str]] = set()
    for c in combos:
        for k, v in c.items():
            key = (k, json.dumps(v, sort_keys=True))
            if key not in seen:
                seen.add(key)
                _check_value(base, k, v, source, "grid" if grids else "points")
    points, ids = [], set()
    varied: list[str] = []
    setups_checked: set[str] = set()
    for c in combos:
        for k in c:
            if k not in varied:
                varied.append(k)
        sc = parse_scenario(_apply(base, c, source, "grid"), source=source)
        pid = point_id(sc)
        if pid in ids:
            continue  # the same resolved scenario listed twice runs once
        ids.add(pid)
        if check_setup:
            _check_setup(sc, c, source, setups_checked)
        points.append(Point(pid, c, sc))

    sp = raw.get("speedup")
    speedup = None
    if sp is not None:
        if not isinstance(sp, dict) or set(sp) - {"field", "target", "baseline", "metric"}:
            raise ScenarioError(f"{source}: field speedup = {sp!r}: use field, target, baseline, metric")
        speedup = Speedup(**sp)
        _apply(base, {speedup.field: speedup.target}, source, "speedup")
    plots = []
    for p in raw.get("plot", []) or []:
        try:
            plots.append(PlotSpec(**p))
        except TypeError:
            raise ScenarioError(f"{source}: field plot = {p!r}: use kind, x, y, value, title, where") from None
        if plots[-1].kind not in ("heatmap", "line"):
            raise ScenarioError(f"{source}: field plot.kind = {plots[-1].kind!r}: use heatmap or line")
    name = raw.get("name") or path.stem
    return SweepSpec(str(name), source, base_sc, points, varied, speedup, plots)


def _check_setup(sc: Scenario, overrides: dict, source: str, done: set[str]) -> None:
    """Resolve model, profile, trace and KV budget once per distinct combination."""
    from granisim.experiments.run import prepare

    key = json.dumps([sc.model.model_dump(), sc.hardware.model_dump(), sc.workload.trace,
                      sc.workload.prefix_len if sc.workload.kind != "azure" else 0], sort_keys=True)
    if key in done:
        return
    done.add(key)
    where = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    try:
        prepare(sc, source)
    except ScenarioError as err:
        raise ScenarioError(f"{err} (point {where})") from None
