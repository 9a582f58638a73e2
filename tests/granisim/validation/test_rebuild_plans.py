"""A validation run's plans rebuilt from its per-step records (granisim.validation.plans.rebuild_plans)."""

import numpy as np
import pandas as pd
import pytest

from granisim.core.serving_loop import ServingLoop
from granisim.config.scenario import load_scenario
from granisim.costmodel.executor import CostExecutor
from granisim.experiments.run import prepare
from granisim.fleet.build import simulate_fleet
from granisim.validation.plans import PlanMismatch, rebuild_plans
from granisim.validation.validate import PairedExecutor
from tests.granisim.simhelpers import TINY_TOML, NoisyEngine

TOML = 'name = "tiny-rebuild"\n' + TINY_TOML
FLEET = TOML + '[fleet]\nreplicas = 3\nrouter = "cache_aware"\n'


def _key(plans):
    return [(p.step, tuple((r.rid, r.num_new) for r in p.requests)) for p in plans]


def _measured(path, noisy=True):
    """A run's steps frame and plans, as `validate` records them (replica columns for a fleet)."""
    sc = load_scenario(path)
    execs = []

    def make(setup):
        real = NoisyEngine(setup, len(execs), 0.5, 2.0) if noisy else CostExecutor(setup.profile, setup.model)
        execs.append(PairedExecutor(real, setup.profile, setup.model, idle=False))
        return execs[-1]

    if sc.fleet is None:
        ServingLoop(prepare(sc), make(prepare(sc)), progress=False).run()
        rows = execs[0].rows
    else:
        simulate_fleet(sc, str(path), make, progress=False)
        rows = [{"replica": k, "incarnation": 0, **r} for k, e in enumerate(execs) for r in e.rows]
    return pd.DataFrame(rows), [p for e in execs for p in e.plans]


@pytest.mark.parametrize("text", [TOML, FLEET], ids=["single", "fleet"])
def test_rebuilt_plans_are_the_measured_runs(tmp_path, text):
    """Replaying the measured step times gives back the run's own plans, also behind a router. The noise makes
    the measured schedule differ from the cost model's (checked), so a rebuild that priced steps itself fails."""
    path = tmp_path / "s.toml"
    path.write_text(text)
    steps, plans = _measured(path)
    assert _key(_measured(path, noisy=False)[1]) != _key(plans), "the noise did not change the schedule"
    assert _key(rebuild_plans(path, steps)) == _key(plans)


def test_a_schedule_that_differs_is_refused(tmp_path):
    """Steps given to the wrong replica (planted: replica labels rotated) or from another seed: PlanMismatch."""
    path = tmp_path / "s.toml"
    path.write_text(FLEET)
    steps, _ = _measured(path)
    with pytest.raises(PlanMismatch):
        rebuild_plans(path, steps.assign(replica=(steps.replica + 1) % 3))
    other = tmp_path / "o.toml"
    other.write_text(FLEET.replace("seed = 5", "seed = 6"))
    with pytest.raises(PlanMismatch):
        rebuild_plans(other, steps)



def test_host_time_between_steps_leaves_out_idling(tmp_path):
    """Each step's host_between_s is the wall time since the previous step's call returned, less the idling in
    between; the first step has none. A fake clock makes the times exact."""
    now = [0.0]

    class Real(NoisyEngine):
        def execute(self, plan):
            now[0] += 0.5  # the step itself: not host time between steps
            return super().execute(plan)

        def idle(self, seconds):
            now[0] += seconds

    path = tmp_path / "s.toml"
    path.write_text(TOML)
    _, plans = _measured(path, noisy=False)
    setup = prepare(load_scenario(path))
    paired = PairedExecutor(Real(setup, 0, 0.5, 2.0), setup.profile, setup.model, clock=lambda: now[0])
    paired.execute(plans[0])
    now[0] += 0.25  # host work
    paired.idle(2.0)  # a gap between arrivals
    now[0] += 0.125  # more host work
    paired.execute(plans[1])
    paired.execute(plans[2])
    got = [r["host_between_s"] for r in paired.rows]
    assert np.isnan(got[0]) and got[1:] == [0.375, 0.0]


@pytest.mark.parametrize("text", [TOML, FLEET], ids=["single", "fleet"])
def test_a_run_folder_that_measured_nothing_is_one_line(tmp_path, capsys, text):
    """`validation rebuild-plans` pointed at a `granisim run` folder (steps priced by the cost model, no measured
    columns): one line naming its steps.parquet, exit 2. catches: an AttributeError traceback from inside the
    serving loop ('Series' object has no attribute 'tokens'), for one GPU and for a fleet."""
    from granisim.cli import main
    from tests.granisim.cli_errors import one_line_error

    run = tmp_path / "run"
    (tmp_path / "s.toml").write_text(text)
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(run)]) == 0
    (run / "scenario.toml").write_text(text)
    capsys.readouterr()
    rc = main(["validation", "rebuild-plans", str(run)])
    one_line_error(capsys, rc, f"{run / 'steps.parquet'}: not the steps of a `granisim validate` run", "no column")
    assert not (run / "plans.pkl").exists()
