"""The stored plans of a validation run (``plans.pkl``, written by :func:`granisim.validation.validate.validate`).

Plans pickled before the package layout changed name their classes by the old module paths;
:func:`load_plans` reads both.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pandas as pd

from granisim.config.files import one_line

# module path in older plans.pkl files -> where the class lives now
RENAMED = {"granisim.plan": "granisim.core.contract"}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return super().find_class(RENAMED.get(module, module), name)


def load_plans(path: Path) -> list:
    """A run's stored plans; a ValueError naming the file where it is not a pickled list of plans."""
    with open(path, "rb") as f:
        try:
            plans = _Unpickler(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError,
                IndexError, KeyError) as err:
            raise ValueError(f"{path}: not a run's pickled plans ({one_line(err)})") from None
    if not isinstance(plans, list):
        raise ValueError(f"{path}: not a run's pickled plans (a {type(plans).__name__}, not a list)")
    for plan in plans:
        _fill_defaults(plan)
    return plans


def _fill_defaults(obj) -> None:
    """Give a plan pickled before a field existed (e.g. ``BatchPlan.transfers``) that field's default, and so
    for its requests and groups: an unpickled slotted dataclass leaves a slot its state lacks unset."""
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        if not hasattr(obj, f.name):
            if f.default is not dataclasses.MISSING:
                object.__setattr__(obj, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                object.__setattr__(obj, f.name, f.default_factory())
        value = getattr(obj, f.name, None)
        if isinstance(value, tuple):
            for item in value:
                _fill_defaults(item)


# ---- plans rebuilt from a run's per-step records --------------------------------------------------

class PlanMismatch(ValueError):
    """The scenario does not reproduce the measured run's schedule (another scenario, seed or code)."""


class MeasuredReplay:
    """An executor that gives back a measured run's steps in order (durations and parts) and checks that each
    plan is the one the run executed (its batch size and token count)."""

    needs_layouts = False
    max_steps_per_plan = 1

    def __init__(self, rows: pd.DataFrame, where: str):
        self.rows, self.where, self.i = rows.reset_index(drop=True), where, 0

    def execute(self, plan):
        from granisim.core.contract import StepResult
        from granisim.core.metrics import BREAKDOWN_KEYS

        if self.i >= len(self.rows):
            raise PlanMismatch(f"{self.where}: the rebuilt run has more steps than the {len(self.rows)} measured")
        r = self.rows.iloc[self.i]
        self.i += 1
        if len(plan.requests) != r.batch or plan.num_tokens != r.tokens:
            raise PlanMismatch(f"{self.where}, step {self.i}: the rebuilt plan has {len(plan.requests)} requests and "
                               f"{plan.num_tokens} tokens, the measured step {int(r.batch)} and {int(r.tokens)}")
        return StepResult(float(r.measured_s), {k: float(r[f"measured_{k}"]) for k in BREAKDOWN_KEYS})


def rebuild_plans(scenario_path: Path, steps: pd.DataFrame, steps_source: str = "steps") -> list:
    """A validation run's plans (as ``validate`` stores them) rebuilt on the CPU from its ``steps.parquet``: the
    scenario is served again with every step lasting what it measured, so the scheduler (and a fleet's router)
    makes the same decisions. Every rebuilt plan is checked against its measured step (:class:`PlanMismatch`
    when the schedule differs). A fleet run's steps carry ``replica`` and ``incarnation`` columns; runs with
    faults (a replica's second incarnation) are not supported. ``steps_source`` names the frame in errors."""
    from granisim.config.scenario import load_scenario
    from granisim.core.metrics import BREAKDOWN_KEYS
    from granisim.validation.validate import PairedExecutor

    scenario = load_scenario(scenario_path)
    need = ["batch", "tokens", "measured_s", *(f"measured_{k}" for k in BREAKDOWN_KEYS)]
    need += ["replica", "incarnation"] if scenario.fleet is not None else []
    missing = [c for c in need if c not in steps.columns]
    if missing:  # e.g. a `granisim run` folder's steps, which the cost model priced: nothing measured to replay
        raise ValueError(f"{steps_source}: not the steps of a `granisim validate` run of {scenario_path} (no column "
                         f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    if scenario.fleet is None:
        from granisim.core.serving_loop import ServingLoop
        from granisim.experiments.run import prepare

        setup = prepare(scenario, str(scenario_path))
        execs = [PairedExecutor(MeasuredReplay(steps, str(scenario_path)), setup.profile, setup.model, idle=False)]
        ServingLoop(setup, execs[0], progress=False).run()
    else:
        from granisim.fleet.build import simulate_fleet

        if (steps.incarnation > 0).any():
            raise PlanMismatch(f"{scenario_path}: a run with faults (replica incarnations) cannot be rebuilt")
        execs = []

        def make(setup):  # the fleet builds its replicas in order, once each without faults
            k = len(execs)
            execs.append(PairedExecutor(MeasuredReplay(steps[steps.replica == k], f"{scenario_path}: replica {k}"),
                                        setup.profile, setup.model, idle=False))
            return execs[-1]

        simulate_fleet(scenario, str(scenario_path), make, progress=False)
    done = sum(e.real.i for e in execs)
    if done != len(steps):
        raise PlanMismatch(f"{scenario_path}: the rebuilt run has {done} steps, the measured one {len(steps)}")
    return [p for e in execs for p in e.plans]


def main(argv: list[str] | None = None) -> int:
    """granisim validation rebuild-plans RUN_DIR [SCENARIO]: writes RUN_DIR/plans.pkl."""
    import sys

    from granisim.config.files import OneLineParser

    ap = OneLineParser(prog="granisim validation rebuild-plans",
                       description="rebuild a validation run's plans.pkl from its steps.parquet")
    ap.add_argument("run", type=Path, help="the run's folder (steps.parquet; scenario.toml unless SCENARIO)")
    ap.add_argument("scenario", type=Path, nargs="?", help="the scenario it ran (default RUN/scenario.toml)")
    args = ap.parse_args(argv)
    toml = args.scenario or args.run / "scenario.toml"
    for f in (args.run / "steps.parquet", toml):
        if not f.is_file():
            print(f"error: {f}: no such file", file=sys.stderr)
            return 2
    try:
        plans = rebuild_plans(toml, pd.read_parquet(args.run / "steps.parquet"), str(args.run / "steps.parquet"))
    except PlanMismatch as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    (args.run / "plans.pkl").write_bytes(pickle.dumps(plans))
    print(f"{args.run / 'plans.pkl'}: {len(plans)} plans, each matching its measured step")
    return 0
