"""A scenario field written in the file that has no effect where the file runs is refused, through the real CLI:
exit 2 and one line naming the file, the field and the value (granisim/config/scenario.py, ``_INERT`` and
``_INERT_BY_RUN``). Fields that act somewhere, even subtly, stay accepted, and so does every shipped scenario
and sweep file.

Planted bug (tried, seen failing, removed): dropping the ``policy.m_sat`` rule from ``_INERT_BY_RUN`` let
"m_sat under cost dispatch" and "m_sat under token" run (rc 0), and the sweep-base case below then loaded."""

import subprocess
import tomllib
from pathlib import Path

import pytest

from granisim.cli import main
from tests.granisim.cli_errors import one_line_error
from granisim.config.scenario import (ScenarioError, check_effective_in_runs, load_scenario, read_scenario,
                                      scenario_runs)

ROOT = Path(__file__).resolve().parents[3]
SMALL = "[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 4\nrate = 5.0\nmax_output_len = 8\n"
FLEET = "[fleet]\nreplicas = 2\n"


def _write(tmp_path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- refused by `granisim run` (the file as written): (toml text, field, value as printed, why) ------------------
REFUSED = {
    "hot_fraction under token": ("[policy]\nname = 'token'\nhot_fraction = 0.3\n", "policy.hot_fraction", "0.3",
                                 "unless policy.name = 'granikv'"),
    "adaptive hot_fraction under paged16": ("[policy]\nname = 'paged16'\nhot_fraction = 'adaptive'\n",
                                            "policy.hot_fraction", "'adaptive'", "no HOT pool"),
    "hot_fraction where every group runs token": (
        "[policy]\nhot_fraction = 0.3\n[[fleet.groups]]\nreplicas = 1\npolicy = 'token'\n[[fleet.groups]]\n"
        "replicas = 1\npolicy = 'paged16'\n", "policy.hot_fraction", "0.3", "[[fleet.groups]]"),
    "page_size under granikv (its default, written)": ("[policy]\npage_size = 16\n", "policy.page_size", "16",
                                                       "unless policy.name = 'paged'"),
    "page_size under paged16": ("[policy]\nname = 'paged16'\npage_size = 32\n", "policy.page_size", "32",
                                "paged<N> names its own page size"),
    "dispatch under token": ("[policy]\nname = 'token'\ndispatch = 'cost'\n", "policy.dispatch", "'cost'",
                             "no prefix pass"),
    "m_sat under cost dispatch": ("[policy]\ndispatch = 'cost'\nm_sat = 512\n", "policy.m_sat", "512",
                                  "unless policy.dispatch = 'threshold'"),
    "m_sat under token": ("[policy]\nname = 'token'\nm_sat = 512\n", "policy.m_sat", "512", "policy.name = 'granikv'"),
    "staleness under round_robin": (FLEET + "staleness_s = 0.5\n", "fleet.staleness_s", "0.5", "'round_robin'"),
    "balance_abs under least_load": (FLEET + "router = 'least_load'\nbalance_abs = 8\n", "fleet.balance_abs", "8",
                                     "'cache_aware' or 'hot_aware'"),
    "balance_rel under role_affinity": (FLEET + "router = 'role_affinity'\nbalance_rel = 1.5\n", "fleet.balance_rel",
                                        "1.5", "'cache_aware' or 'hot_aware'"),
    "cache_threshold under hot_aware": (FLEET + "router = 'hot_aware'\ncache_threshold = 0.3\n",
                                        "fleet.cache_threshold", "0.3", "unless fleet.router = 'cache_aware'"),
    "load_factor under cache_aware": (FLEET + "router = 'cache_aware'\nload_factor = 2.0\n", "fleet.load_factor",
                                      "2.0", "unless fleet.router = 'role_affinity'"),
    "rebalance_every under round_robin": (FLEET + "rebalance_every = 64\n", "fleet.rebalance_every", "64",
                                          "unless fleet.router = 'hot_aware'"),
    "reserve_gb beside kv_budget_tokens": ("[hardware]\nkv_budget_tokens = 100000\nreserve_gb = 2.0\n",
                                           "hardware.reserve_gb", "2.0", "hardware.kv_budget_tokens is set"),
    "mem_fraction beside kv_budget_tokens at tp 1": ("[hardware]\nkv_budget_tokens = 100000\nmem_fraction = 0.8\n",
                                                     "hardware.mem_fraction", "0.8", "hardware.tp = 1"),
    "trace beside lengths_trace under Poisson": (
        "[workload]\nnum_requests = 4\nroles = 2\nprefix_len = 512\nlengths_trace = 'arxiv'\ntrace = 'T'\n",
        "workload.trace", "T.csv", "workload.lengths_trace set"),
    "prefix admission on a replay": ("[workload]\nkind = 'azure'\nnum_requests = 4\n[scheduler]\n"
                                     "admission = 'prefix'\n", "scheduler.admission", "'prefix'",
                                     "kind = 'azure'"),
}


def _trace(tmp_path) -> str:
    t = tmp_path / "T.csv"
    t.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,4\n0.5,20,4\n")
    return str(t)


@pytest.mark.parametrize("text,field,value,why", REFUSED.values(), ids=REFUSED.keys())
def test_an_inert_field_is_refused_when_run_as_written(tmp_path, capsys, monkeypatch, text, field, value, why):
    _trace(tmp_path)
    monkeypatch.chdir(tmp_path)  # the trace by a short relative name: an error line shortens long values
    text = text.replace("'T'", "'T.csv'")
    small = "" if "[workload]" in text else SMALL
    path = _write(tmp_path, small + text)
    line = one_line_error(capsys, main(["run", str(path), "--out", str(tmp_path / "o")]),
                           str(path), f"field {field} = ", value, "has no effect", why)
    assert not (tmp_path / "o").exists(), line  # nothing ran


# --- refused by a command that runs the file under its own policies or routers: (toml, argv, field, label) --------
IN_RUNS = {
    "compare --policies without granikv": ("[policy]\nhot_fraction = 0.3\n", ["compare", "--policies",
                                           "token,paged16"], "policy.hot_fraction", "--policies token,paged16"),
    "compare's default policies never run 'paged'": ("[policy]\nname = 'paged'\npage_size = 32\n", ["compare"],
                                                     "policy.page_size", "compare's default --policies"),
    "compare --routers without cache_aware": (FLEET + "router = 'cache_aware'\ncache_threshold = 0.3\n",
                                              ["compare", "--routers", "round_robin,hot_aware"],
                                              "fleet.cache_threshold", "--routers round_robin,hot_aware"),
    "capacity --policies without granikv": ("[policy]\ndispatch = 'cost'\n", ["capacity", "--slo", "ttft_p99=2s",
                                            "--policies", "token"], "policy.dispatch", "--policies token"),
    "fleet capacity --routers without hot_aware": (
        FLEET + "router = 'hot_aware'\nrebalance_every = 64\n",
        ["capacity", "--slo", "ttft_p99=2s", "--rate", "5", "--routers", "least_load", "--max-replicas", "2"],
        "fleet.rebalance_every", "--routers least_load"),
}


@pytest.mark.parametrize("text,argv,field,label", IN_RUNS.values(), ids=IN_RUNS.keys())
def test_an_inert_field_is_refused_in_every_run_of_a_command(tmp_path, capsys, text, argv, field, label):
    path = _write(tmp_path, SMALL + text)
    rc = main([argv[0], str(path), *argv[1:], "--out", str(tmp_path / "o")])
    line = one_line_error(capsys, rc, str(path), f"field {field} = ", "has no effect", f"in every run of {label}")
    assert not (tmp_path / "o").exists(), line


# --- accepted: the field acts in some run, or acts subtly ----------------------------------------------------------
def _runs_accept(path: Path, **runs) -> None:
    sc, written = read_scenario(path)
    check_effective_in_runs(written, scenario_runs(sc, **runs), str(path), " (in every run)")


def test_a_field_that_acts_in_some_run_of_the_command_is_accepted(tmp_path):
    """A token scenario's hot_fraction acts in compare's granikv run; a round_robin fleet's cache_threshold in
    `compare --routers cache_aware`; the same files run as written are refused (above)."""
    token = _write(tmp_path, SMALL + "[policy]\nname = 'token'\nhot_fraction = 0.3\n", "token.toml")
    _runs_accept(token, policies=["granikv", "token", "paged16"])
    with pytest.raises(ScenarioError, match="in every run"):
        _runs_accept(token, policies=["token", "paged16"])
    fleet = _write(tmp_path, SMALL + FLEET + "cache_threshold = 0.3\n", "fleet.toml")
    _runs_accept(fleet, routers=["round_robin", "cache_aware"])
    with pytest.raises(ScenarioError, match="fleet.cache_threshold = 0.3"):
        load_scenario(fleet)


ACCEPTED = {
    "hot_fraction where one group runs granikv": "[policy]\nname = 'token'\nhot_fraction = 0.3\n[[fleet.groups]]\n"
                                                 "replicas = 1\n[[fleet.groups]]\nreplicas = 1\npolicy = 'granikv'\n",
    "page_size under paged": "[policy]\nname = 'paged'\npage_size = 32\n",
    "m_sat under threshold dispatch": "[policy]\ndispatch = 'threshold'\nm_sat = 512\n",
    "dispatch under granikv": "[policy]\ndispatch = 'auto'\n",
    "mem_fraction beside kv_budget_tokens at tp 4 (bounds the weight shard)":
        "[model]\nname = 'llama-3.1-70b'\n[hardware]\nprofile = 'h200'\ntp = 4\nkv_budget_tokens = 100000\n"
        "mem_fraction = 0.8\n",
    "reserve_gb without kv_budget_tokens": "[hardware]\nreserve_gb = 2.0\n",
    "staleness under least_load": FLEET + "router = 'least_load'\nstaleness_s = 0.5\n",
    "balance under hot_aware": FLEET + "router = 'hot_aware'\nbalance_abs = 8\nbalance_rel = 1.5\n",
    "trace beside lengths_trace counting every row": "[workload]\nnum_requests = 0\nroles = 2\nprefix_len = 512\n"
                                                      "lengths_trace = 'arxiv'\ntrace = 'T'\n",
    "trace beside lengths_trace with trace arrivals": "[workload]\narrivals = 'trace'\nroles = 2\nprefix_len = 512\n"
                                                       "lengths_trace = 'arxiv'\ntrace = 'T'\n",
    "prefix admission on a replay with aging": "[workload]\nkind = 'azure'\nnum_requests = 4\n[scheduler]\n"
                                               "admission = 'prefix'\nadmission_max_wait_s = 1.0\n",
    "fcfs admission on a replay": "[workload]\nkind = 'azure'\nnum_requests = 4\n[scheduler]\nadmission = 'fcfs'\n",
}


@pytest.mark.parametrize("text", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_a_field_that_acts_is_accepted(tmp_path, text):
    text = text.replace("'T'", repr(_trace(tmp_path)))
    load_scenario(_write(tmp_path, ("" if "[workload]" in text else SMALL) + text))


def test_a_sweep_refuses_a_base_field_that_acts_at_no_point_and_a_varied_one(tmp_path):
    """The base's fields are checked against the sweep's points, not the base alone; the grid shares the rules."""
    from granisim.experiments.sweep_file import load_sweep

    _write(tmp_path, SMALL + "[policy]\nname = 'token'\nm_sat = 512\n", "base.toml")
    sweep = "base = 'base.toml'\n[grid]\n\"policy.name\" = [{}]\n"
    assert len(load_sweep(_write(tmp_path, sweep.format('"granikv", "token"'), "ok.toml")).points) == 2
    with pytest.raises(ScenarioError, match=r"field base = 'base.toml': .*field policy.m_sat = 512: has no effect"
                                            r".*at every point of the sweep"):
        load_sweep(_write(tmp_path, sweep.format('"token", "paged16"'), "bad.toml"))
    varied = "[base]\n[base.hardware]\nkv_budget_tokens = 100000\n[grid]\n\"hardware.reserve_gb\" = [1.0, 2.0]\n"
    with pytest.raises(ScenarioError, match="grid field hardware.reserve_gb: has no effect when"):
        load_sweep(_write(tmp_path, varied, "varied.toml"))


# --- every shipped scenario and sweep file still loads ---------------------------------------------------------------
def _shipped_toml() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "*.toml"], cwd=ROOT, capture_output=True, text=True, check=True)
        files = out.stdout.split()
    except (OSError, subprocess.CalledProcessError):  # no git: the folders that hold them
        files = [str(p.relative_to(ROOT)) for d in ("scenarios", "sweeps", "reports", "granisim/config/scenarios")
                 for p in (ROOT / d).rglob("*.toml")]
    return sorted(f for f in files if f not in ("pyproject.toml", "granisim/experiments/mutants.toml"))


SHIPPED = _shipped_toml()


def test_the_shipped_files_are_found():
    assert any(f.startswith("scenarios/") for f in SHIPPED) and any(f.startswith("sweeps/") for f in SHIPPED)
    assert any(f.startswith("reports/") for f in SHIPPED)


@pytest.mark.parametrize("rel", SHIPPED)
def test_every_shipped_scenario_and_sweep_file_validates(rel):
    """As `granisim run` (scenario: read, checked, resolved) or `granisim sweep` (every point) reads it."""
    from granisim.experiments.run import prepare
    from granisim.experiments.sweep_file import load_sweep

    path = ROOT / rel
    if {"base", "grid", "points"} & set(tomllib.loads(path.read_text())):
        load_sweep(path)
    else:
        prepare(load_scenario(path), str(path))
