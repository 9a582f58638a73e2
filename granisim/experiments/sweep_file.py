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
:func:`granisim.experiments.run.prepare`) before anything runs, and so are ``[speedup]`` and
``[[plot]]`` (their fields must be scenario fields or results columns, and the values they
select must occur in some point): a mistake is a :class:`ScenarioError` with one line
naming the file, the field and the value.

A point is identified by a stable hash of its full resolved scenario (sorted JSON), so a
re-run finds the points it already has whatever the sweep file's order or layout.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path

from granisim.config.scenario import (Scenario, ScenarioError, check_effective_in_runs, inert, parse_scenario,
                                      parse_scenario_file_data, read_scenario, read_toml, short_repr)
from granisim.core.metrics import BREAKDOWN_KEYS

POINT_SCHEMA = "granisim-point/1"  # bump when the meaning of a resolved scenario changes
_TOP_KEYS = {"name", "base", "set", "grid", "points", "speedup", "plot", "description"}

# numeric results columns a point adds to its scenario fields (granisim.experiments.sweep.run_point;
# tests/granisim/test_bad_input.py checks this list against a real point)
METRIC_COLUMNS = (
    "requests", "completed", "rejected", "duration_s", "throughput_rps", "output_tok_s", "ttft_p50_s",
    "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "queue_p50_s", "preemptions",
    "prefix_hit_rate", "steps", "plans", "mean_batch", "dense_groups", "cascade_groups", "evictions",
    "kv_budget_tokens", "m_sat", *(f"t_{k}_s" for k in BREAKDOWN_KEYS), "mean_group_size", "hot_placements",
    "hot_fallbacks", "hot_evictions", "compactions", "copied_tokens", "evicted_tokens", "hot_capacity_end",
    "sim_wall_s")
# written only by a point with a host KV tier (hardware.host_kv_gb > 0): seconds its copies added to steps (the
# summary's figure and the breakdown total of its steps' t_host_copy)
HOST_METRIC_COLUMNS = ("host_copy_s", "t_host_copy_s")


def _metrics(points: list["Point"]) -> tuple[str, ...]:
    """The results metrics these points write: METRIC_COLUMNS, + HOST_METRIC_COLUMNS where some has a host tier."""
    host = any(p.scenario.hardware.host_kv_gb > 0 for p in points)
    return METRIC_COLUMNS + (HOST_METRIC_COLUMNS if host else ())


SPEEDUP_OR = "'speedup' or "  # what a plot's value may name besides a metric


def _not_a_metric(name, points: list["Point"], other: str = "") -> str:
    """Why ``name`` is not a results metric of these points, and what to use instead (``other`` or a metric)."""
    why = ("written only by points with a host tier, and no point has hardware.host_kv_gb > 0; "
           if name in HOST_METRIC_COLUMNS else "")
    return f"{why}use {other}one of {', '.join(_metrics(points))}"


def scenario_fields(model=Scenario, prefix: str = "", optional: bool = False) -> list[str]:
    """Every leaf field of the scenario schema by dotted name, an optional table as one field (``fleet``: the
    results table's scenario columns of a point without it); with ``optional``, that table's fields instead
    (``fleet.router``: what [speedup] and [[plot]] may name)."""
    out = []
    for name, f in model.model_fields.items():
        table = f.annotation if hasattr(f.annotation, "model_fields") else None
        if table is None and optional and type(None) in getattr(f.annotation, "__args__", ()):
            table = next((a for a in f.annotation.__args__ if hasattr(a, "model_fields")), None)  # Model | None
        out.extend(scenario_fields(table, f"{prefix}{name}.", optional) if table is not None else [f"{prefix}{name}"])
    return out


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
    tables = [prof.linear_table, prof.kernel_table, *prof.more_linear_tables]
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


def _sub_fields(annotation):
    """The fields of a section's model, also for an optional section (``FleetCfg | None``); None for a leaf and
    for an array of tables (``fleet.groups``, ``fleet.faults``: set as a whole list, not field by field)."""
    fields = getattr(annotation, "model_fields", None)
    if fields is None and type(None) in typing.get_args(annotation):
        for arg in typing.get_args(annotation):
            fields = fields or getattr(arg, "model_fields", None)
    return fields


def _apply(data: dict, dotted: dict, source: str, where: str) -> dict:
    """Set dotted fields in a scenario dict; unknown names raise ScenarioError."""
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for key, value in dotted.items():
        target, parts = data, key.split(".")
        schema = Scenario.model_fields
        for p in parts[:-1]:
            f = schema.get(p)
            sub = _sub_fields(f.annotation) if f is not None else None
            if sub is None:
                raise ScenarioError(f"{source}: unknown scenario field {key!r} (in {where})")
            if target.get(p) is None:  # an optional section the base leaves out (e.g. [fleet])
                target[p] = {}
            target = target[p]
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
        twice = next((x for i, x in enumerate(v) if x in v[:i]), None)
        if twice is not None:
            raise ScenarioError(f"{source}: field {k} = {short_repr(v)} in {where}: the value "
                                f"{short_repr(twice)} is listed twice (each value runs once)")
    keys = list(flat)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(flat[k] for k in keys))]


def _base_data(raw: dict, path: Path, source: str) -> tuple[dict, dict, str, str]:
    """The base scenario (dumped), its tables as written, the source its errors name and the prefix an error about
    it takes. Its fields whose effect hangs on the policy or router are checked against the points
    (:func:`_check_base_in_points`): the grid may run the base under others."""
    base = raw.get("base", {})
    if isinstance(base, str):
        p = Path(base)
        if not p.is_absolute():
            p = path.parent / p
        prefix = f"{source}: field base = {base!r}: "
        try:
            sc, written = read_scenario(p)
        except ScenarioError as err:
            raise ScenarioError(f"{prefix}{err}") from None
        return sc.model_dump(mode="json"), written, str(p), prefix
    if isinstance(base, dict):
        sc = parse_scenario_file_data(base, source=f"{source} [base]", as_written=False)
        return sc.model_dump(mode="json"), base, f"{source} [base]", ""
    raise ScenarioError(f"{source}: field base = {base!r}: give a scenario path or an inline [base] table")


def _check_base_in_points(written: dict, points: list["Point"], base_source: str, prefix: str,
                          overridden: set[str]) -> None:
    """A field the base writes that acts at no point (policy.hot_fraction where no point runs granikv, ...): the
    same refusal a scenario file run as written gets; fields the grid, points or ``set`` give anew are skipped."""
    try:
        check_effective_in_runs(written, [p.scenario for p in points], base_source, " (at every point of the sweep)",
                                skip=tuple(overridden))
    except ScenarioError as err:
        raise ScenarioError(f"{prefix}{err}") from None


def _check_value(base: dict, key: str, value, source: str, where: str) -> Scenario:
    data = _apply(base, {key: value}, source, where)
    try:
        return parse_scenario(data, source=source, strict=True)
    except ScenarioError as err:
        raise ScenarioError(f"{err} (in {where})") from None


def load_sweep(path: str | Path, check_setup: bool = True) -> SweepSpec:
    """Parse and validate a sweep file; every point's scenario is resolved here."""
    path = Path(path)
    source = str(path)
    raw = read_toml(path, "sweep file")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise ScenarioError(f"{source}: unknown sweep key {unknown[0]!r} (use {', '.join(sorted(_TOP_KEYS))})")
    return sweep_from_dict(raw, source, path, check_setup)


def sweep_from_dict(raw: dict, source: str = "<sweep>", path: Path | None = None,
                    check_setup: bool = True) -> SweepSpec:
    path = path or Path(".") / "sweep.toml"
    for key in ("name", "description"):
        if key in raw and not (isinstance(raw[key], str) and raw[key].strip()):
            raise ScenarioError(f"{source}: field {key} = {short_repr(raw[key])}: give a non-empty string")
    base, written, base_source, base_prefix = _base_data(raw, path, source)
    fixed = raw.get("set", {})
    if not isinstance(fixed, dict):
        raise ScenarioError(f"{source}: field set = {fixed!r}: give a table of dotted overrides")
    fixed = _flatten(fixed, "set", source)
    for k, v in fixed.items():
        _check_value(base, k, v, source, "set")
    base = _apply(base, fixed, source, "set")
    base_sc = parse_scenario(base, source=source, strict=True)

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
    for i, e in enumerate(extra):
        if e in extra[:i]:
            raise ScenarioError(f"{source}: points #{i + 1} = {short_repr(e)}: the same as points "
                                f"#{extra.index(e) + 1} (each point runs once)")
    if listed is not None and not listed:
        raise ScenarioError(f"{source}: points = []: empty list of points (empty grid)")
    if combos and extra:  # [[points]] crossed with the grid: a field every point sets leaves the grid's unused
        for k in sorted({k for c in combos for k in c if all(k in e for e in extra)}):
            raise ScenarioError(f"{source}: field points.{k}: every point sets {k}, replacing each of the grid's "
                                f"values; give it in one place")
        combos = [{**c, **e} for e in extra for c in combos]
    elif extra:
        combos = extra
    for k in sorted(k for k in fixed if all(k in c for c in combos)):  # a default no point keeps
        raise ScenarioError(f"{source}: field set.{k}: every point gives {k} its own value, so set's never acts; "
                            f"give it in one place")

    # every distinct (field, value) checked alone first, so that the error of a point that fails names the culprit;
    # a value that is only valid together with its point's other values (policy.name = 'token' beside
    # policy.host_tier = 'slabs+pages' over a base with host_tier = 'slabs') is no mistake
    where = "grid" if grids else "points"
    seen: set[tuple[str, str]] = set()
    alone: dict[tuple[str, str], ScenarioError] = {}
    for c in combos:
        for k, v in c.items():
            key = (k, json.dumps(v, sort_keys=True))
            if key not in seen:
                seen.add(key)
                try:
                    _check_value(base, k, v, source, where)
                except ScenarioError as err:
                    alone[key] = err
    points, ids = [], set()
    varied: list[str] = []
    setups_checked: set[str] = set()
    for c in combos:
        for k in c:
            if k not in varied:
                varied.append(k)
        try:
            sc = parse_scenario(_apply(base, c, source, where), source=source, strict=True)
        except ScenarioError as err:
            culprit = next((alone[key] for key in ((k, json.dumps(v, sort_keys=True)) for k, v in c.items())
                            if key in alone), None)
            raise (culprit or ScenarioError(f"{err} (in {where})")) from None
        pid = point_id(sc)
        if pid in ids:
            continue  # the same resolved scenario listed twice runs once
        ids.add(pid)
        if check_setup:
            _check_setup(sc, c, source, setups_checked)
        points.append(Point(pid, c, sc))

    for k in varied:  # a varied field that acts at no point gives the same results at every value
        why = _inert_in_sweep(k, points[0].scenario)
        if why and all(_inert_in_sweep(k, p.scenario) for p in points):
            raise ScenarioError(f"{source}: {where} field {k}: {why} (at every point of the sweep)")
    _check_base_in_points(written, points, base_source, base_prefix, set(varied) | set(fixed))
    speedup = _speedup(raw.get("speedup"), base, points, source)
    plots = _plots(raw.get("plot"), speedup, points, source)
    name = raw.get("name") or path.stem
    return SweepSpec(str(name), source, base_sc, points, varied, speedup, plots)


def _inert_in_sweep(dotted: str, sc: Scenario) -> str | None:
    """Why varying ``dotted`` changes nothing at point ``sc``: :func:`inert`'s reasons, and two a scenario file
    may write but a grid should not vary (the run's name; a router in front of one replica)."""
    if dotted == "name":
        return "names the run's output, it changes nothing in the run; vary a field that does"
    if dotted == "fleet.router" and (sc.fleet is None or sc.fleet.size < 2):
        return "one replica (no [fleet] section, or fleet.replicas = 1): every router gives the same run"
    return inert(dotted, sc)


def _value_of(sc: Scenario, dotted: str):
    """A dotted field's value, also for a field the dump leaves out at its default (``hardware.tp`` = 1, ...)."""
    v = sc.model_dump(mode="json")
    try:
        for part in dotted.split("."):
            v = v[part]
    except KeyError:  # dropped at its default (point ids stay stable as fields are added): read the model
        v = sc
        for part in dotted.split("."):
            if v is None:  # a field of an optional table the point has not (fleet.router without [fleet])
                return None
            v = getattr(v, part)
    return v


def scenario_columns(sc: Scenario) -> dict:
    """Every scenario field of ``sc`` by dotted name (the results table's scenario columns), with the fields the
    dump leaves out at their default filled in, so that a column never reads empty where the point has a value."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    cols = flat(sc.model_dump(mode="json"))
    for name in scenario_fields():
        if name not in cols and not any(k.startswith(name + ".") for k in cols):
            cols[name] = _value_of(sc, name)
    if sc.policy.host_tier is None:  # unset: what a tier would move under the point's policy
        cols["policy.host_tier"] = sc.policy.host_tier_mode
    return cols


def _some_point_has(points: list[Point], dotted: str, value) -> bool:
    """Does some point's resolved scenario have ``dotted`` = ``value`` (compared as the results table's
    filters do, as text)?"""
    return any(str(_value_of(p.scenario, dotted)) == str(value) for p in points)


def _speedup(sp, base: dict, points: list[Point], source: str) -> Speedup | None:
    if sp is None:
        return None
    keys = {"field", "target", "baseline", "metric"}
    if not isinstance(sp, dict) or set(sp) - keys:
        bad = sorted(set(sp) - keys)[0] if isinstance(sp, dict) else None
        what = f"unknown key {bad!r}" if bad else f"{short_repr(sp)} is not a table"
        raise ScenarioError(f"{source}: field speedup: {what}; use field, target, baseline, metric")
    speedup = Speedup(**sp)
    fields = scenario_fields(optional=True)
    if not isinstance(speedup.field, str) or speedup.field not in fields:
        raise ScenarioError(f"{source}: field speedup.field = {short_repr(speedup.field)}: not a scenario field "
                            f"(e.g. policy.name, policy.dispatch)")
    if not isinstance(speedup.metric, str) or speedup.metric not in _metrics(points):
        raise ScenarioError(f"{source}: field speedup.metric = {short_repr(speedup.metric)}: not a results metric; "
                            f"{_not_a_metric(speedup.metric, points)}")
    for key in ("target", "baseline"):
        value = getattr(speedup, key)
        if not _some_point_has(points, speedup.field, value):  # a value some point has is valid (with its point)
            sc = _check_value(base, speedup.field, value, source, f"speedup.{key}")  # a bad value: its own error
            typed = _value_of(sc, speedup.field)  # as the points hold it: target = 3 for a float field is 3.0
            if not _some_point_has(points, speedup.field, typed):
                raise ScenarioError(f"{source}: field speedup.{key} = {short_repr(value)}: no point has "
                                    f"{speedup.field} = {short_repr(value)} (the speedup column would be empty)")
            speedup = replace(speedup, **{key: typed})
    return speedup


def _plots(raw_plots, speedup: Speedup | None, points: list[Point], source: str) -> list[PlotSpec]:
    if raw_plots is None:
        return []
    if not isinstance(raw_plots, list):
        raise ScenarioError(f"{source}: field plot = {short_repr(raw_plots)}: give [[plot]] tables")
    fields, plots = scenario_fields(optional=True), []
    columns = set(fields) | set(_metrics(points))
    for i, p in enumerate(raw_plots):
        where = f"plot #{i + 1}"
        if not isinstance(p, dict):
            raise ScenarioError(f"{source}: field plot = {short_repr(p)} ({where}): give a table")
        try:
            spec = PlotSpec(**p)
        except TypeError:
            bad = sorted(set(p) - set(PlotSpec.__dataclass_fields__))
            what = f"unknown key {bad[0]!r}" if bad else "missing kind or x"
            raise ScenarioError(f"{source}: field plot ({where}): {what}; use kind, x, y, value, title, "
                                f"where") from None
        if spec.kind not in ("heatmap", "line"):
            raise ScenarioError(f"{source}: field plot.kind = {short_repr(spec.kind)} ({where}): use heatmap or line")
        axes = [("x", spec.x)]
        if spec.kind == "heatmap" and spec.y is None:
            raise ScenarioError(f"{source}: field plot.y ({where}): a heatmap needs a second axis y")
        if spec.y is not None:
            ys = spec.y.split(",") if isinstance(spec.y, str) and spec.kind == "line" else [spec.y]
            axes += [("y", y) for y in ys]
        for key, axis in axes:
            if not isinstance(axis, str) or axis not in fields:
                raise ScenarioError(f"{source}: field plot.{key} = {short_repr(axis)} ({where}): not a scenario "
                                    f"field (e.g. workload.roles, policy.hot_fraction)")
        if spec.value == "speedup":
            if speedup is None:
                raise ScenarioError(f"{source}: field plot.value = 'speedup' ({where}): needs a [speedup] table")
        elif not isinstance(spec.value, str) or spec.value not in columns:
            raise ScenarioError(f"{source}: field plot.value = {short_repr(spec.value)} ({where}): not a results "
                                f"column; {_not_a_metric(spec.value, points, SPEEDUP_OR)}")
        if not isinstance(spec.title, str):
            raise ScenarioError(f"{source}: field plot.title = {short_repr(spec.title)} ({where}): give a string")
        if spec.where is not None:
            if not isinstance(spec.where, dict):
                raise ScenarioError(f"{source}: field plot.where = {short_repr(spec.where)} ({where}): give a table "
                                    f"of field = value")
            for k, v in spec.where.items():
                if k not in fields:
                    raise ScenarioError(f"{source}: field plot.where.{k} ({where}): not a scenario field")
                if not _some_point_has(points, k, v):
                    raise ScenarioError(f"{source}: field plot.where.{k} = {short_repr(v)} ({where}): no point "
                                        f"has that value (the plot would be empty)")
        plots.append(spec)
    return plots


def _check_setup(sc: Scenario, overrides: dict, source: str, done: set[str]) -> None:
    """Resolve model, profile, trace, KV budget, pool split and (for a fleet) every replica group and fault once
    per distinct combination of the fields they read (all but the name, the seed, the scheduler and the rate)."""
    from granisim.experiments.run import prepare
    from granisim.fleet.build import replica_specs

    data = sc.model_dump(mode="json")
    for k in ("name", "seed", "scheduler"):
        data.pop(k, None)
    data["workload"].pop("rate", None)
    key = json.dumps(data, sort_keys=True)
    if key in done:
        return
    done.add(key)
    where = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    try:
        if sc.fleet is not None:
            replica_specs(sc, source)
        else:
            prepare(sc, source)
    except ScenarioError as err:
        raise ScenarioError(f"{err} (point {where})") from None
