"""Bad input through the real CLI: every mistake exits 2 with exactly one line on stderr naming the
file, the field (or a trace's row and column) and the value; never a traceback, never a silent
clamp or drop. One parametrised test per kind of mistake (scenario fields, trace files, sweep
files, profile files), each case a file a user could write."""

import json
from pathlib import Path

import pytest

from granisim.cli import main
from tests.granisim.cli_errors import one_line_error

ROOT = Path(__file__).resolve().parents[2]
SMALL = "[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 5\nrate = 5.0\nmax_output_len = 8\n"
HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


# --- scenario fields: (toml text, field, value as printed) -------------------------------------------------
SCENARIOS = {
    "string for a number": ("[workload]\nrate = '5'\n", "workload.rate", "'5'"),
    "bool for an int": ("[scheduler]\nmax_running = true\n", "scheduler.max_running", "true"),
    "fraction for an int": ("[workload]\nnum_requests = 2.5\n", "workload.num_requests", "2.5"),
    "float for an int": ("[workload]\nroles = 4.0\n", "workload.roles", "4.0"),
    "inf rate": ("[workload]\nrate = 1e400\n", "workload.rate", "inf"),
    "nan rate": ("[workload]\nrate = nan\n", "workload.rate", "nan"),
    "inf time_scale": ("[workload]\nkind = 'azure'\ntime_scale = inf\n", "workload.time_scale", "inf"),
    "nan hot_fraction": ("[policy]\nhot_fraction = nan\n", "policy.hot_fraction", "nan"),
    "inf queue timeout": ("[scheduler]\nqueue_timeout_s = inf\n", "scheduler.queue_timeout_s", "inf"),
    "nan mem_fraction": ("[hardware]\nmem_fraction = nan\n", "hardware.mem_fraction", "nan"),
    "negative reserve": ("[hardware]\nreserve_gb = -1\n", "hardware.reserve_gb", "-1"),
    "zero rate": ("[workload]\nrate = 0\n", "workload.rate", "0"),
    "zero max_batch_tokens": ("[scheduler]\nmax_batch_tokens = 0\n", "scheduler.max_batch_tokens", "0"),
    "negative seed": ("seed = -1\n", "seed", "-1"),
    "empty name": ("name = ''\n", "name", "''"),
    "blank name (was an output folder named by spaces)": ("name = '   '\n", "name", "'   '"),
    "a name leaving out/ (was written to ../../escaped)": ("name = '../../escaped'\n", "name", "'../../escaped'"),
    "paged0": ("[policy]\nname = 'paged0'\n", "policy.name", "'paged0'"),
    "unknown policy": ("[policy]\nname = 'vllm'\n", "policy.name", "'vllm'"),
    "unknown literal": ("[workload]\nkind = 'chat'\n", "workload.kind", "'chat'"),
    "unknown field": ("[workload]\nratee = 3\n", "workload.ratee", ""),
    "unknown section": ("[worklaod]\nrate = 3\n", "worklaod", ""),
    "section not a table": ("workload = 3\n", "workload", "3"),
    "reserve takes all memory": ("[hardware]\nreserve_gb = 1000\n", "hardware.reserve_gb", "1000"),
    "weights do not fit": ("[hardware]\nmem_fraction = 0.1\n", "hardware.mem_fraction", "0.1"),
    "kv budget beyond the GPU": ("[hardware]\nkv_budget_tokens = 100000000000\n", "hardware.kv_budget_tokens",
                                 "100000000000"),
    "budget below one request": ("[hardware]\nkv_budget_tokens = 1000\n[workload]\nprefix_len = 16384\n",
                                 "workload.prefix_len", "16384"),
    "page larger than the budget": ("[policy]\nname = 'paged'\npage_size = 1000000\n", "policy.page_size",
                                    "1000000"),
    "paged<N> larger than the budget": ("[policy]\nname = 'paged1000000'\n", "policy.name", "'paged1000000'"),
    "no COLD pool left": ("[policy]\nhot_fraction = 1.0\n", "policy.hot_fraction", "1.0"),
    # catches: accepted, and every request rejected (COLD held 2 tokens)
    "a COLD pool below the smallest request": ("[policy]\nhot_fraction = 0.9999\n[hardware]\nkv_budget_tokens = 20000\n"
                                               "[workload]\nprefix_len = 1000\n", "policy.hot_fraction", "0.9999"),
    "unknown model": ("[model]\nname = 'gpt-9'\n", "model.name", "'gpt-9'"),
    "unknown profile": ("[hardware]\nprofile = 'tpu-v9'\n", "hardware.profile", "'tpu-v9'"),
    "rate with azure": ("[workload]\nkind = 'azure'\nrate = 3.0\n", "workload.rate", "3.0"),
    "rate with trace arrivals": ("[workload]\narrivals = 'trace'\nrate = 3.0\n", "workload.rate", "3.0"),
    "time_scale with poisson": ("[workload]\ntime_scale = 2.0\n", "workload.time_scale", "2.0"),
    "poisson with azure": ("[workload]\nkind = 'azure'\narrivals = 'poisson'\n", "workload.arrivals", "'poisson'"),
    "roles with azure": ("[workload]\nkind = 'azure'\nroles = 8\n", "workload.roles", "8"),
    "zipf_s without zipf": ("[workload]\nzipf_s = 1.5\n", "workload.zipf_s", "1.5"),
    "think time with one turn": ("[workload]\nthink_time_s = 2.0\n", "workload.think_time_s", "2.0"),
    "aging without prefix admission": ("[scheduler]\nadmission_max_wait_s = 1.0\n",
                                       "scheduler.admission_max_wait_s", "1.0"),
    "suffix_scale past any length": ("[workload]\nsuffix_scale = 1e300\n", "workload.suffix_scale", "1e+300"),
    "output_scale past any length": ("[workload]\noutput_scale = 1e300\n", "workload.output_scale", "1e+300"),
    "followup_scale past any length": ("[workload]\nturns = 2\nfollowup_scale = 1e300\n",
                                       "workload.followup_scale", "1e+300"),
    "more requests than trace rows": ("[workload]\nkind = 'azure'\nnum_requests = 100000\n",
                                      "workload.num_requests", "100000"),
    # each caught a traceback (exit 1, 8 TiB asked of numpy), a line naming nothing, or NaN / 0 latencies at exit 0
    "requests past any memory": ("[workload]\nnum_requests = 1099511627776\n", "workload.num_requests",
                                 "1099511627776"),
    "reserve near the float maximum": ("[hardware]\nreserve_gb = 1e300\n", "hardware.reserve_gb", "1e+300"),
    "a rate near the float minimum": ("[workload]\nnum_requests = 20\nrate = 5e-324\n", "workload.rate", "5e-324"),
    "arrivals over 34 years": ("[workload]\nnum_requests = 20\nrate = 1e-300\n", "workload.rate", "1e-300"),
    "think time past any clock": ("[workload]\nturns = 50\nthink_time_s = 1e300\n", "workload.think_time_s",
                                  "1e+300"),
    "think times adding up past the clock": ("[workload]\nnum_requests = 2\nturns = 10\nthink_time_s = 1e9\n"
                                             "prefix_len = 64\n", "workload.think_time_s", "1000000000.0"),
}


@pytest.mark.parametrize("text,field,value", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_bad_scenario_field(tmp_path, capsys, text, field, value):
    path = tmp_path / "s.toml"
    path.write_text(text)
    line = one_line_error(capsys, main(["run", str(path), "--out", str(tmp_path / "o")]), str(path), field, value)
    assert not (tmp_path / "o").exists(), line  # nothing ran


def test_an_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    """catches: `--out ''` wrote into out/NAME of the current folder, as if --out were not given."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.toml"
    path.write_text(SMALL)
    one_line_error(capsys, main(["run", str(path), "--out", ""]), "--out ''", "empty")
    assert not (tmp_path / "out").exists()


# --- scenario files that are not scenarios: (bytes or None for "a directory", what the line says) ---------
FILES = {
    "not UTF-8": (b"name = '\xff\xfe'\n", "not UTF-8"),
    "not TOML": (b"this is = = not toml\n", "not valid TOML"),
    "missing": (None, "cannot read scenario file"),
    "a directory": ("dir", "cannot read scenario file"),
}


@pytest.mark.parametrize("content,needle", FILES.values(), ids=FILES.keys())
def test_bad_scenario_file(tmp_path, capsys, content, needle):
    path = tmp_path / "s.toml"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    one_line_error(capsys, main(["run", str(path), "--out", str(tmp_path / "o")]), str(path), needle)


# --- trace files: (csv text, what the line names) -------------------------------------------------------------
TRACES = {
    "garbage row": (HEADER + "0,10,5\nabc,xx,yy\n", ["row 2", "column arrived_at", "'abc'"]),
    "garbage token count": (HEADER + "0,10,5\n1,xx,5\n", ["row 2", "column num_prefill_tokens", "'xx'"]),
    "nan timestamp": (HEADER + "0,10,5\nnan,10,5\n", ["row 2", "column arrived_at", "nan"]),
    "empty cell": (HEADER + "0,10,5\n1,,5\n", ["row 2", "column num_prefill_tokens", "nan"]),
    "inf token count": (HEADER + "0,10,5\n1,10,inf\n", ["row 2", "column num_decode_tokens", "inf"]),
    "unsorted timestamps": (HEADER + "0,10,5\n2,10,5\n1,10,5\n", ["row 3", "column arrived_at", "= 1",
                                                                  "arrival order"]),
    "negative token count": (HEADER + "0,10,5\n1,-3,5\n", ["row 2", "column num_prefill_tokens", "-3"]),
    "zero token count": (HEADER + "0,10,5\n1,10,0\n", ["row 2", "column num_decode_tokens", "= 0"]),
    "fractional token count": (HEADER + "0,10,5\n1,10.5,5\n", ["row 2", "column num_prefill_tokens", "10.5"]),
    "missing column": ("arrived_at,num_prefill_tokens\n0,10\n", ["num_decode_tokens"]),
    "header only": (HEADER, ["no rows"]),
    "empty file": ("", ["empty"]),
    "ragged row": (HEADER + "0,10,5\n1,10,5,7,8\n", ["row 2 has 5 fields, the header 3"]),
    # pandas took the first column as the index and shifted every value one column left, without a word
    "every row one field more": (HEADER + "0,100,5,1\n1,200,6,1\n", ["row 1 has 4 fields, the header 3"]),
    "first row one field more": (HEADER + "0,10,5,7\n1,10,5\n", ["row 1 has 4 fields"]),
    "short row": (HEADER + "0,10\n1,10,5\n", ["row 1 has 2 fields"]),
    "a column named twice": (HEADER.strip() + ",num_prefill_tokens\n0,10,5,999\n", ["'num_prefill_tokens' appears 2 times"]),
    "token count past 2^53": (HEADER + "0,10,5\n1,99999999999999999999999,5\n",
                              ["row 2", "column num_prefill_tokens", "below 2^53"]),
    "arrivals over 2^30 s": (HEADER + "0,10,5\n1e300,10,5\n", ["2 replayed arrivals span 1e+300 s"]),
    "not UTF-8": (HEADER.encode() + b"0,10,5\n1,\xff\xfe,5\n", ["not UTF-8", "offset 57"]),
    "a directory": ("dir", ["cannot read"]),
    "more requests than rows": (HEADER + "0,10,5\n1,10,5\n2,10,5\n", ["workload.num_requests = 30", "3 rows"]),
}


@pytest.mark.parametrize("csv,needles", TRACES.values(), ids=TRACES.keys())
def test_bad_trace(tmp_path, capsys, csv, needles):
    trace = tmp_path / "t.csv"
    if csv == "dir":
        trace.mkdir()
    elif isinstance(csv, bytes):
        trace.write_bytes(csv)
    else:
        trace.write_text(csv)
    n = 30 if "num_requests = 30" in needles[0] else 0
    path = tmp_path / "s.toml"
    path.write_text(f"[workload]\nkind = 'azure'\ntrace = '{trace}'\nnum_requests = {n}\n")
    one_line_error(capsys, main(["run", str(path), "--out", str(tmp_path / "o")]), str(path), "workload.trace"
                    if n == 0 else "workload.num_requests", str(trace) if n == 0 else "", *needles)


def test_a_shipped_lengths_trace_named_as_a_trace_says_where_it_goes(tmp_path, capsys, monkeypatch):
    """catches: `workload.trace = 'arxiv'` said only "file not found", though arxiv is a shipped name that
    workload.lengths_trace takes."""
    monkeypatch.chdir(tmp_path)  # no file named arxiv here
    path = tmp_path / "s.toml"
    path.write_text("[workload]\nkind = 'azure'\ntrace = 'arxiv'\nnum_requests = 5\n")
    one_line_error(capsys, main(["run", str(path), "--out", str(tmp_path / "o")]), str(path),
                   "workload.trace = 'arxiv'", "file not found", "workload.lengths_trace = 'arxiv'")


def test_a_valid_trace_replays_every_row_unchanged(tmp_path, capsys):
    """The checks do not touch good data: a 3-row trace gives 3 requests with its own lengths (no clamp)."""
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "0,10,5\n0.5,20,3\n1.0,7,1\n")
    path = tmp_path / "s.toml"
    path.write_text(f"[workload]\nkind = 'azure'\ntrace = '{trace}'\n")
    out = tmp_path / "o"
    assert main(["run", str(path), "--out", str(out)]) == 0, capsys.readouterr().err
    import pandas as pd

    reqs = pd.read_parquet(out / "requests.parquet")
    assert reqs.prompt_len.tolist() == [10, 20, 7] and reqs.output_len.tolist() == [5, 3, 1]


# --- sweep files: (sweep text after an inline small base, field, value) --------------------------------------
BASE = "[base.workload]\nroles = 2\nprefix_len = 512\nnum_requests = 5\nrate = 5.0\nmax_output_len = 8\n"
GRID = '[grid]\n"policy.name" = ["granikv", "token"]\n"workload.roles" = [1, 2]\n'
SPEEDUP = '[speedup]\nfield = "policy.name"\ntarget = "granikv"\nbaseline = "token"\nmetric = "throughput_rps"\n'
SWEEPS = {
    "plot over an unknown axis": (GRID + '[[plot]]\nkind = "line"\nx = "workload.nonsense"\n',
                                  "plot.x", "'workload.nonsense'"),
    "plot over an unknown y": (GRID + '[[plot]]\nkind = "heatmap"\nx = "workload.roles"\ny = "rolez"\n',
                               "plot.y", "'rolez'"),
    "line over an unknown y of several": (GRID + '[[plot]]\nkind = "line"\nx = "workload.roles"\n'
                                          'y = "policy.name,nope"\n', "plot.y", "'nope'"),
    "heatmap without y": (GRID + '[[plot]]\nkind = "heatmap"\nx = "workload.roles"\n', "plot.y", "heatmap"),
    "plot of an unknown value": (GRID + '[[plot]]\nkind = "line"\nx = "workload.roles"\nvalue = "speed"\n',
                                 "plot.value", "'speed'"),
    "speedup plot without [speedup]": (GRID + '[[plot]]\nkind = "line"\nx = "workload.roles"\n',
                                       "plot.value", "'speedup'"),
    "plot kind": (GRID + '[[plot]]\nkind = "pie"\nx = "workload.roles"\n', "plot.kind", "'pie'"),
    "plot unknown key": (GRID + '[[plot]]\nkind = "line"\nx = "workload.roles"\ncolour = "red"\n', "plot",
                         "'colour'"),
    "plot filter on an unknown field": (GRID + SPEEDUP + '[[plot]]\nkind = "line"\nx = "workload.roles"\n'
                                        'where = { "policy.dispach" = "cost" }\n', "plot.where.policy.dispach", ""),
    "plot filter no point has": (GRID + SPEEDUP + '[[plot]]\nkind = "line"\nx = "workload.roles"\n'
                                 'where = { "policy.dispatch" = "cost" }\n', "plot.where.policy.dispatch", "'cost'"),
    "plot as one table": (GRID + '[plot]\nkind = "line"\nx = "workload.roles"\n', "plot", "kind"),
    "speedup metric nonsense": (GRID + SPEEDUP.replace('"throughput_rps"', '"nonsense"'), "speedup.metric",
                                "'nonsense'"),
    "speedup over an unknown field": (GRID + SPEEDUP.replace('"policy.name"', '"policy.nom"'), "speedup.field",
                                      "'policy.nom'"),
    "speedup target no point has": (GRID + SPEEDUP.replace('target = "granikv"', 'target = "paged16"'),
                                    "speedup.target", "'paged16'"),
    "speedup target not a value": (GRID + SPEEDUP.replace('baseline = "token"', 'baseline = "vllm"'),
                                   "policy.name", "'vllm'"),
    "speedup unknown key": (GRID + SPEEDUP + 'metrics = "x"\n', "speedup", "'metrics'"),
    "grid value not a list": ('[grid]\n"workload.roles" = 4\n', "workload.roles", "4"),
    "grid value inf": ('[grid]\n"workload.rate" = [1.0, inf]\n', "workload.rate", "inf"),
    "grid value string for number": ('[grid]\n"workload.roles" = [1, "2"]\n', "workload.roles", "'2'"),
    "grid field unknown": ('[grid]\n"workload.rolez" = [1, 2]\n', "workload.rolez", ""),
    # catches: a dotted name through an array of tables was taken for a field of one table (a traceback where the
    # base has [[fleet.groups]], a message about a tuple where it has none)
    "set into an array of tables": ('set = { "fleet.groups.replicas" = 2 }\n' + GRID
                                    + '[[base.fleet.groups]]\nreplicas = 1\n', "'fleet.groups.replicas'", "(in set)"),
    "grid into an array of tables": ('[grid]\n"fleet.faults.at_s" = [1.0, 2.0]\n', "'fleet.faults.at_s'", "(in grid)"),
    "name not a string": ('name = 3\n' + GRID, "name", "3"),
    # catches: exit 0 with one of the two values silently unused
    "set and grid on one field": ('set = { "workload.roles" = 3 }\n' + GRID, "set.workload.roles", "never acts"),
    "every point over a grid field": (GRID + '[[points]]\n"workload.roles" = 4\n', "points.workload.roles",
                                      "replacing each of the grid's values"),
    "unknown sweep key": ('plots = 3\n' + GRID, "plots", ""),
}


@pytest.mark.parametrize("text,field,value", SWEEPS.values(), ids=SWEEPS.keys())
def test_bad_sweep_file(tmp_path, capsys, text, field, value):
    path = tmp_path / "sw.toml"
    head, _, rest = text.partition("[grid]")  # top-level keys must precede the base tables
    path.write_text(head + BASE + ("[grid]" + rest if rest else ""))
    rc = main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"])
    one_line_error(capsys, rc, str(path), field, value)
    assert not (tmp_path / "o").exists()  # nothing ran


def test_bad_sweep_file_encoding(tmp_path, capsys):
    path = tmp_path / "sw.toml"
    path.write_bytes(b"name = '\xff'\n")
    one_line_error(capsys, main(["sweep", str(path)]), str(path), "not UTF-8")


def test_metric_columns_are_what_a_point_writes():
    """The sweep file's list of results metrics (what [speedup] metric and plot value may name) is
    exactly what a real point adds to its scenario fields. Planted bug: dropping "evictions" from
    METRIC_COLUMNS (or a new summary key not added to it) fails here."""
    from granisim.config.scenario import parse_scenario
    from granisim.experiments.sweep import run_point
    from granisim.experiments.sweep_file import METRIC_COLUMNS, scenario_fields

    sc = parse_scenario({"workload": {"roles": 1, "prefix_len": 64, "num_requests": 2, "max_output_len": 2}})
    row = run_point("x", json.dumps(sc.model_dump(mode="json")), "{}")
    assert set(row) - {"point_id", "overrides", "scenario"} - set(scenario_fields()) == set(METRIC_COLUMNS)


def test_host_metric_columns_are_what_a_host_tier_point_adds():
    """A point with a host KV tier writes HOST_METRIC_COLUMNS besides METRIC_COLUMNS (the sweep file accepts them
    where some point has a tier). Planted bug: a new host-tier summary key not added to HOST_METRIC_COLUMNS."""
    from granisim.config.scenario import parse_scenario
    from granisim.experiments.sweep import run_point
    from granisim.experiments.sweep_file import HOST_METRIC_COLUMNS, METRIC_COLUMNS, scenario_fields

    sc = parse_scenario({"hardware": {"host_kv_gb": 1.0},
                         "workload": {"roles": 1, "prefix_len": 64, "num_requests": 2, "max_output_len": 2}})
    row = run_point("x", json.dumps(sc.model_dump(mode="json")), "{}")
    extra = set(row) - {"point_id", "overrides", "scenario"} - set(scenario_fields())
    assert extra == set(METRIC_COLUMNS) | set(HOST_METRIC_COLUMNS)


# --- profile files (`granisim profile check`): (edit of a shipped profile, field, value) ------------------
def _nan_cell(doc, tmp):
    lines = (ROOT / "granisim/config/data" / doc["linear_table"]["file"]).read_text().splitlines()
    head = lines[0].split(",")
    row = lines[2].split(",")
    row[head.index("time_stats.mlp_up_proj.median")] = "nan"
    (tmp / "lin.csv").write_text("\n".join([lines[0], lines[1], ",".join(row)] + lines[3:]) + "\n")
    doc["linear_table"]["file"] = "lin.csv"


def _zero_tokens(doc, tmp):
    lines = (ROOT / "granisim/config/data" / doc["linear_table"]["file"]).read_text().splitlines()
    row = lines[1].split(",")
    row[lines[0].split(",").index("num_tokens")] = "0"
    (tmp / "lin.csv").write_text("\n".join([lines[0], ",".join(row)] + lines[2:]) + "\n")
    doc["linear_table"]["file"] = "lin.csv"


PROFILES = {
    "nan coefficient": (lambda d, t: d["coefficients"]["hbm_bandwidth"].update(value=float("nan")),
                        "coefficients.hbm_bandwidth.value", "nan"),
    "inf coefficient": (lambda d, t: d["coefficients"]["hbm_bandwidth"].update(value=float("inf")),
                        "coefficients.hbm_bandwidth.value", "inf"),
    "negative coefficient": (lambda d, t: d["coefficients"]["hbm_bandwidth"].update(value=-1.0),
                             "coefficients.hbm_bandwidth.value", "-1.0"),
    # passed as > 0, and a run priced on it exited 0 with every latency NaN
    "bandwidth of 1e-300 B/s": (lambda d, t: d["coefficients"]["hbm_bandwidth"].update(value=1e-300),
                                "coefficients.hbm_bandwidth.value", "1e-300"),
    "string coefficient": (lambda d, t: d["coefficients"]["hbm_bandwidth"].update(value="fast"),
                           "coefficients.hbm_bandwidth.value", "'fast'"),
    "wrong unit": (lambda d, t: d["coefficients"]["hbm_bandwidth"].update(unit="GB/s"),
                   "coefficients.hbm_bandwidth.unit", "'GB/s'"),
    "missing coefficient": (lambda d, t: d["coefficients"].pop("hbm_bandwidth"), "coefficients.hbm_bandwidth",
                            "(missing)"),
    "unknown coefficient": (lambda d, t: d["coefficients"].update(warp_speed=d["coefficients"]["hbm_bandwidth"]),
                            "coefficients.warp_speed", "'warp_speed'"),
    "nan in the linear table": (_nan_cell, "linear_table.file", "row 2, column time_stats.mlp_up_proj.median = 'nan'"),
    "zero num_tokens in the table": (_zero_tokens, "linear_table.file", "row 1, column num_tokens = '0'"),
}


@pytest.mark.parametrize("edit,field,value", PROFILES.values(), ids=PROFILES.keys())
def test_bad_profile(tmp_path, capsys, edit, field, value):
    doc = json.loads((ROOT / "granisim/config/profiles/a100-80gb.json").read_text())
    edit(doc, tmp_path)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))  # NaN and Infinity as JSON writes them (json.loads reads them back)
    one_line_error(capsys, main(["profile", "check", str(path)]), str(path), field, value)


@pytest.mark.parametrize("content,needle", [(b'{"name": "\xff"}', "not UTF-8"), (b"{nope", "invalid JSON")],
                         ids=["not UTF-8", "not JSON"])
def test_bad_profile_file(tmp_path, capsys, content, needle):
    path = tmp_path / "p.json"
    path.write_bytes(content)
    one_line_error(capsys, main(["profile", "check", str(path)]), str(path), needle)


# --- the same scenario mistake through every command that reads a scenario -----------------------------------
@pytest.mark.parametrize("argv", [["run", "S"], ["compare", "S"], ["capacity", "S", "--slo", "ttft_p99=2s"],
                                  ["validate", "S"]], ids=["run", "compare", "capacity", "validate"])
def test_every_command_reports_a_scenario_mistake(tmp_path, capsys, argv):
    path = tmp_path / "s.toml"
    path.write_text(SMALL.replace("rate = 5.0", "rate = inf"))
    argv = [str(path) if a == "S" else a for a in argv] + ["--out", str(tmp_path / "o")]
    one_line_error(capsys, main(argv), str(path), "workload.rate", "inf")


def test_the_docs_list_every_metric_column():
    """docs/scenarios.md names every results metric a sweep's [speedup] or [[plot]] may use.
    Planted bug: removing `sim_wall_s` from the docs' list fails here."""
    from granisim.core.metrics import BREAKDOWN_KEYS
    from granisim.experiments.sweep_file import METRIC_COLUMNS

    doc = (ROOT / "docs" / "scenarios.md").read_text()
    parts = {f"t_{k}_s": k for k in BREAKDOWN_KEYS}
    missing = [m for m in METRIC_COLUMNS if f"`{parts.get(m, m)}`" not in doc]
    assert not missing and "`t_<part>_s`" in doc, missing


@pytest.mark.parametrize("argv", [["compare"], ["capacity", "--slo", "ttft_p99=2s"],
                                  ["capacity", "--slo", "ttft_p99=2s", "--rate", "5"]],
                         ids=["compare", "capacity", "capacity --rate"])
def test_a_bad_policy_in_policies_before_anything_runs(tmp_path, capsys, argv):
    """catches: `compare --policies granikv,vllm` simulated granikv (and wrote its folder) before refusing vllm,
    and its error named '<override>' rather than the option the user typed."""
    path = tmp_path / "s.toml"
    path.write_text(SMALL)
    out = tmp_path / "o"
    rc = main([argv[0], str(path), *argv[1:], "--policies", "granikv,vllm", "--out", str(out)])
    line = one_line_error(capsys, rc, "--policies granikv,vllm", "policy.name = 'vllm'")
    assert "<override>" not in line
    assert not out.exists()  # nothing ran


# --- paper and calibrate: an argument or a raw measurement folder a user could give --------------------------
def _raw(tmp, edit: dict) -> Path:
    """A copy of the shipped H200 raw folder with some files replaced (name -> text)."""
    import shutil

    raw = tmp / "raw"
    shutil.copytree(ROOT / "calibration/raw/h200", raw)
    for name, text in edit.items():
        (raw / name).write_text(text)
    return raw


_LIN = "op,family,n,median_us\n"


def _att(*times: str) -> str:
    """attention.csv with the columns the fits read: one decode row per time."""
    from granisim.calibration.raw import ATTENTION_COLUMNS

    row = "decode,slots,4,1,1024,4,1,1,1,{}\n"
    return ",".join(ATTENTION_COLUMNS) + "\n" + "".join(row.format(t) for t in times)


CALIBRATE = {
    "paper: unknown profile (was a KeyError after the sweep)": (
        {}, ["paper", "--profiles", "h200,nope", "--out", "T/o", "--num-requests", "2", "--workers", "1"],
        ["--profiles 'nope'", "unknown profile"]),
    "paper: no profile (was exit 0)": ({}, ["paper", "--profiles", ",", "--out", "T/o"], ["--profiles ','"]),
    "fit: meta.json a list": ({"meta.json": "[1]"}, ["calibrate", "fit", "R", "--out", "T/p.json"],
                              ["R/meta.json", "not a JSON object"]),
    "fit: attention.csv with no timed row": ({"attention.csv": _att("")},
                                             ["calibrate", "fit", "R", "--out", "T/p.json"],
                                             ["R/attention.csv", "no measured rows"]),
    # each a TypeError traceback (exit 1), or a row dropped without a word
    "fit: a time that is a word": ({"attention.csv": _att("fast")},
                                   ["calibrate", "fit", "R", "--out", "T/p.json"],
                                   ["R/attention.csv", "median_us", "'fast' (row 1)", "not a time"]),
    "check: a time that is a word": ({"attention.csv": _att("12", "fast")},
                                     ["calibrate", "check", "R"], ["R/attention.csv", "'fast' (row 2)"]),
    "fit: a negative time": ({"linear.csv": _LIN + "x,y,1,-5\n"},
                             ["calibrate", "fit", "R", "--out", "T/p.json"], ["R/linear.csv", "-5 (row 1)"]),
    "fit: --out a folder (was found after the fit)": ({}, ["calibrate", "fit", "R", "--out", "T"], ["--out", "folder"]),
    "fit: --report a file (was found after the fit, its profile written)": (
        {}, ["calibrate", "fit", "R", "--out", "T/q.json", "--report", "T/p.json"], ["--report", "a file is there"]),
    "fit: --out under a file (was found after the fit)": ({}, ["calibrate", "fit", "R", "--out", "T/p.json/q.json"],
                                                          ["--out", "T/p.json/q.json", "p.json is a file, not a folder"]),
    "fit: a time of 0 (was dropped as not measured)": ({"attention.csv": _att("0")},
                                                       ["calibrate", "fit", "R", "--out", "T/p.json"],
                                                       ["R/attention.csv", "median_us", "0 (row 1)", "> 0"]),
    "fit: an infinite time (was fitted, then blamed on the output)": (
        {"attention.csv": _att("12", "inf")}, ["calibrate", "fit", "R", "--out", "T/p.json"],
        ["R/attention.csv", "median_us", "inf (row 2)"]),
    "fit: a shape that is a word (was a bare 'could not convert')": (
        {"attention.csv": _att("12").replace(",4,1,1,1,", ",4,abc,1,1,")}, ["calibrate", "fit", "R", "--out", "T/p.json"],
        ["R/attention.csv", "n_req", "'abc' (row 1)", "not a finite number"]),
    "fit: attention.csv without B (was an AttributeError)": (
        {"attention.csv": _att("12").replace(",B,", ",BB,")}, ["calibrate", "fit", "R", "--out", "T/p.json"],
        ["R/attention.csv", "field B", "missing"]),
    "check: attention.csv without B (was an IndexError)": (
        {"attention.csv": _att("12").replace(",B,", ",BB,")}, ["calibrate", "check", "R"],
        ["R/attention.csv", "field B", "missing"]),
    "fit: a row with a field too many (was skipped)": ({"attention.csv": _att("12") + _att("13").splitlines()[1] + ",x\n"},
                                                       ["calibrate", "fit", "R", "--out", "T/p.json"],
                                                       ["R/attention.csv", "cannot read", "Expected 10 fields"]),
    "check: attention.csv empty": ({"attention.csv": ""}, ["calibrate", "check", "R"],
                                   ["R/attention.csv", "cannot read"]),
    "check: attention.csv without family (was ignored)": ({"attention.csv": "a,median_us\n1,2\n"},
                                                          ["calibrate", "check", "R"], ["R/attention.csv", "family"]),
    "table: linear.csv empty": ({"linear.csv": ""}, ["calibrate", "table", "R", "--profile", "T/p.json"],
                                ["R/linear.csv", "cannot read"]),
    "table: linear.csv without median_us": ({"linear.csv": "op,family,n\nx,y,1\n"},
                                            ["calibrate", "table", "R", "--profile", "T/p.json"],
                                            ["R/linear.csv", "median_us"]),
}


@pytest.mark.parametrize("edit,argv,needles", CALIBRATE.values(), ids=CALIBRATE.keys())
def test_bad_calibrate_or_paper_input(tmp_path, capsys, edit, argv, needles):
    raw = _raw(tmp_path, edit) if "R" in argv else None
    (tmp_path / "p.json").write_text((ROOT / "granisim/config/profiles/h200.json").read_text())

    def sub(s: str) -> str:
        s = s.replace("R/", f"{raw}/") if raw and s.startswith("R/") else (str(raw) if s == "R" else s)
        return str(tmp_path) + s[1:] if s == "T" or s.startswith("T/") else s

    one_line_error(capsys, main([sub(a) for a in argv]), *map(sub, needles))
    assert not (tmp_path / "o").exists()  # the paper ran nothing


def test_paper_with_a_profile_named_twice_runs_nothing(tmp_path, capsys, monkeypatch):
    """catches: `paper --profiles h200,h200` swept h200 twice into one folder and wrote its section twice, where
    `--policies` and `--routers` refuse a name given twice."""
    import granisim.experiments.paper as paper

    monkeypatch.setattr(paper, "run_paper", lambda *a, **k: pytest.fail("ran"))
    rc = main(["paper", "--profiles", "h200,a100-80gb,h200", "--out", str(tmp_path / "o")])
    one_line_error(capsys, rc, "--profiles h200,a100-80gb,h200", "h200 given twice")
    assert not (tmp_path / "o").exists()
