"""A fleet validation run judged again with another profile (granisim.validation.rescore.rescore_fleet)."""

import json

import pandas as pd
import pytest

from granisim.config.scenario import load_scenario
from granisim.validation.fleet_summary import records
from granisim.validation.rescore import main, rescore_fleet
from granisim.validation.validate import validate_fleet
from tests.granisim.simhelpers import TINY_TOML, NoisyEngine

TOML = ('name = "tiny-fleet-rescore"\n' + TINY_TOML
        + '[hardware]\nprofile = "h200-engine"\n[fleet]\nreplicas = 3\nrouter = "cache_aware"\n')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A fleet validation run as `granisim validate` writes it (steps, plans, both requests frames, the report)."""
    root = tmp_path_factory.mktemp("fleet")
    path = root / "s.toml"
    path.write_text(TOML)
    made = []

    def make_real(setup):
        made.append(NoisyEngine(setup, len(made), 0.8, 1.25))
        return made[-1]

    out = root / "machineQ" / "tiny"
    validate_fleet(load_scenario(path), str(path), make_real, out, progress=False)
    return out


def _errors(section: dict) -> tuple:
    return (section["step_errors"]["total"]["median"],
            tuple(round(v["error"], 12) for v in section["end_to_end"].values()))


def test_the_run_s_own_profile_gives_back_its_report(run, tmp_path):
    """Re-scored with the profile it ran with, every fleet-wide and per-replica figure (step errors, end-to-end,
    on the real routing) is the run's own. Planted bug: pricing each replica's steps with the next replica's
    plans, or taking a replica's steps by position, changes the per-replica step errors."""
    old = json.loads((run / "validation.json").read_text())
    new = rescore_fleet(run, run / "scenario.toml", tmp_path / "machineQ" / "tiny")
    assert _errors(new) == _errors(old)
    assert [_errors(r) for r in new["replicas"] if r["end_to_end"]] == \
        [_errors(r) for r in old["replicas"] if r["end_to_end"]]
    assert new["step_errors"] == old["step_errors"]
    assert [r["step_errors"] for r in new["replicas"]] == [r["step_errors"] for r in old["replicas"]]
    assert new["measured_routing"] == old["measured_routing"]
    assert [r["metric"] for r in records([tmp_path / "machineQ" / "tiny"])] == [r["metric"] for r in records([run])]


def test_another_profile_reprices_the_steps_and_keeps_what_was_measured(run, tmp_path):
    """With another profile the steps are priced again (the per-step errors move) and the simulated fleet is run
    again (the predicted figures move), while the measured figures stay the run's own. Planted bug: keeping the
    stored predictions (no re-pricing) leaves the per-step errors as they were."""
    old = json.loads((run / "validation.json").read_text())
    out = tmp_path / "machineQ" / "tiny"
    assert main([str(run), "--profile", "h200", "--fleet-out", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 0
    new = json.loads((out / "validation.json").read_text())
    assert json.loads((tmp_path / "r.json").read_text()) == [new]  # --out: the records (was [] for a fleet)
    assert new["profile"] == "h200" and old["profile"] == "h200-engine"
    assert new["step_errors"]["total"]["median"] != old["step_errors"]["total"]["median"]
    for key, e in new["end_to_end"].items():
        assert e["measured"] == old["end_to_end"][key]["measured"]
    assert any(e["predicted"] != old["end_to_end"][k]["predicted"] for k, e in new["end_to_end"].items())
    steps = pd.read_parquet(run / "steps.parquet")
    assert new["steps"] == len(steps) and sum(r["steps"] for r in new["replicas"]) == len(steps)
    assert pd.read_parquet(out / "measured_requests.parquet").equals(pd.read_parquet(run / "measured_requests.parquet"))


def test_a_scenario_the_fleet_did_not_run_is_refused(run, tmp_path, capsys):
    """Another seed draws other requests: one line naming the scenario, exit 2, nothing written. Planted bug:
    without the check the other scenario's fleet is judged against the run's measurements (exit 0)."""
    other = tmp_path / "other.toml"
    other.write_text((run / "scenario.toml").read_text().replace("seed = 5", "seed = 6"))
    assert "seed = 6" in other.read_text()
    assert main([str(run), "--scenario", str(other), "--fleet-out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(other) in err and "not the scenario" in err
    assert not (tmp_path / "out").exists()
