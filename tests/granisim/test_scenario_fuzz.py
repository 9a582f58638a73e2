"""Fuzz: random TOML scenario documents through `granisim run` (in-process) either run or exit 2 with
one line naming the file, never a traceback.

Documents start from a small valid scenario and get a few random assignments: sections and keys
drawn mostly from the schema's own field names (sometimes garbage), values drawn from the field's
type, its neighbours (inf, nan, 0, negatives, huge), other types and random text; some documents
are random text or bytes. A document that parses and prepares is simulated when it is small
(at most 5 requests, short prefixes); the heavy outputs (parquet, plots) are skipped.

Planted bugs that this test catches (each tried, seen failing, removed): dropping the
``except UnicodeDecodeError`` from ``granisim.config.scenario.read_toml`` (a codec message without
the file), and dropping ``ge=0`` from ``Scenario.seed`` (numpy's "expected non-negative integer" from
inside the run, without file or field).
"""

import contextlib
import io
import json
import math
import tempfile
import typing
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import granisim.cli
from granisim.cli import main
from granisim.config.scenario import Scenario

SMALL = {"workload": {"roles": 2, "prefix_len": 256, "num_requests": 3, "max_output_len": 8}}
GARBAGE_NAMES = st.sampled_from(["", "x", "workload.rate", "Rate", "ratee", "fleet", "0", " ", "é"])


def _sections() -> dict[str, dict]:
    """Each table section of the schema -> {field name: annotation}; top-level scalars under ''."""
    out = {"": {}}
    for name, f in Scenario.model_fields.items():
        model = next((a for a in (f.annotation, *typing.get_args(f.annotation)) if hasattr(a, "model_fields")), None)
        if model is None:
            out[""][name] = f.annotation
        else:
            out[name] = {k: v.annotation for k, v in model.model_fields.items()}
    return out


SECTIONS = _sections()
ANY_SCALAR = st.one_of(st.integers(-3, 10), st.sampled_from([2 ** 31, 2 ** 63 - 1, -(2 ** 63)]),
                       st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=6))
ANY_VALUE = st.one_of(ANY_SCALAR, st.lists(ANY_SCALAR, max_size=3),
                      st.dictionaries(st.text(max_size=4), ANY_SCALAR, max_size=2))
NAMES = st.sampled_from(["llama-3.1-8b", "qwen-2.5-14b", "a100-80gb", "h200", "granikv", "token", "paged",
                         "paged16", "paged0", "paged-1", "adaptive", "", "/nonexistent.csv", "nope"])


def _values(annotation) -> st.SearchStrategy:
    """Values near the field's type (its literals, edge numbers), mixed with any other value."""
    args = typing.get_args(annotation)
    literals = [x for a in (annotation, *args) if typing.get_origin(a) is typing.Literal for x in typing.get_args(a)]
    if literals and not (float in args or int in args):
        typed = st.sampled_from(literals)
    elif annotation is bool:
        typed = st.booleans()
    elif annotation is int or int in args:
        typed = st.one_of(st.integers(0, 6), st.integers(0, 6), st.sampled_from([-1, 0, 1, 64, 2 ** 40]))
    elif annotation is float or float in args:
        typed = st.one_of(st.floats(0, 1), st.floats(0, 1), st.floats(-1, 3),
                          st.sampled_from([0.0, 1.0, math.inf, -math.inf, math.nan, 1e300]))
        if literals:  # e.g. hot_fraction: a number or "adaptive"
            typed = st.one_of(typed, st.sampled_from(literals))
    else:
        typed = NAMES
    return st.one_of(*[typed] * 8, ANY_VALUE)


@st.composite
def documents(draw) -> dict:
    doc = json.loads(json.dumps(SMALL))
    for _ in range(draw(st.integers(0, 3))):
        section = draw(st.sampled_from(sorted(SECTIONS)) if draw(st.integers(0, 9)) else GARBAGE_NAMES)
        fields = SECTIONS.get(section, {})
        if fields and draw(st.integers(0, 9)):
            key = draw(st.sampled_from(sorted(fields)))
            value = draw(_values(fields[key]))
        else:
            key, value = draw(GARBAGE_NAMES), draw(ANY_VALUE)
        if section == "":
            doc[key] = value
        elif section in doc and not isinstance(doc[section], dict):
            doc[section] = value
        else:
            table = doc.setdefault(section, {})
            if not isinstance(table, dict):
                continue
            table[key] = value
    if draw(st.integers(0, 19)) == 0:  # a section that is not a table
        doc[draw(st.sampled_from(sorted(k for k in SECTIONS if k)))] = draw(ANY_SCALAR)
    return doc


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string (JSON's escapes are TOML's)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(doc: dict) -> str:
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines += [f"{json.dumps(kk)} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def _small(sc, fleet_ok: bool = False) -> bool:
    w = sc.workload
    return (1 <= w.num_requests <= 5 and w.prefix_len <= 2048 and w.roles <= 8 and w.turns <= 3
            and w.suffix_scale <= 2 and w.output_scale <= 2 and 1 <= w.max_output_len <= 16
            and sc.model.name == "llama-3.1-8b" and (sc.hardware.kv_budget_tokens or 0) <= 10 ** 6
            and (fleet_ok or getattr(sc, "fleet", None) is None))


def _prepare_and_simulate(scenario, source, out, progress=True, make_executor=None) -> dict:
    """`granisim run`'s work without the output files: prepare, and simulate a small scenario."""
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate

    fleet = getattr(scenario, "fleet", None)
    if fleet is not None:  # N replicas behind a router: each replica's setup is resolved here
        from granisim.fleet.build import replica_specs, simulate_fleet

        replica_specs(scenario, source)
        if _small(scenario, fleet_ok=True) and fleet.size <= 3:
            simulate_fleet(scenario, source, None, progress=False)
        return {}
    setup = prepare(scenario, source)
    if _small(scenario):
        res = simulate(setup, progress=False)
        summarize(requests_frame(res.records), res.steps.frame(), res.end_s)
    return {}


def _check(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["run", str(path), "--out", str(path.parent / "out")])
    lines = err.getvalue().strip().splitlines()
    if rc == 0:
        return
    assert rc == 2, (rc, err.getvalue())
    assert len(lines) == 1 and lines[0].startswith("error: "), err.getvalue()
    assert str(path) in lines[0], lines[0]  # names the file


FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@FUZZ
@given(doc=documents())
def test_random_scenarios_run_or_exit_2_with_one_line(doc):
    with tempfile.TemporaryDirectory() as d, _patched_run_one():
        _check(Path(d) / "s.toml", to_toml(doc).encode())


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(content=st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode),
                         st.builds(lambda t, b: to_toml(SMALL).encode() + t + b, st.binary(max_size=8),
                                   st.binary(max_size=8))))
def test_random_bytes_exit_2_with_one_line(content):
    with tempfile.TemporaryDirectory() as d, _patched_run_one():
        _check(Path(d) / "s.toml", content)


@contextlib.contextmanager
def _patched_run_one():
    """`granisim run` with run_one replaced by :func:`_prepare_and_simulate` and the summary tables
    (of runs that did not happen) printed empty."""
    import granisim.fleet.outputs

    saved = granisim.cli.run_one, granisim.cli.summary_table, granisim.fleet.outputs.fleet_table
    granisim.cli.run_one = _prepare_and_simulate
    granisim.cli.summary_table = granisim.fleet.outputs.fleet_table = lambda *a, **k: ""
    try:
        yield
    finally:
        granisim.cli.run_one, granisim.cli.summary_table, granisim.fleet.outputs.fleet_table = saved


def test_the_fuzz_reaches_valid_runs_and_errors():
    """The generator is not degenerate: among its documents some run (small, simulated) and some fail."""
    from granisim.config.scenario import ScenarioError, parse_scenario

    seen = {"ok": 0, "small": 0, "error": 0}

    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(doc=documents())
    def count(doc):
        try:
            sc = parse_scenario(doc, strict=True)
        except ScenarioError:
            seen["error"] += 1
            return
        seen["ok"] += 1
        seen["small"] += _small(sc)

    count()
    assert seen["small"] >= 20 and seen["error"] >= 20, seen
