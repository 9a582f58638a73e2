"""From a scenario's [fleet] section to replica specs (one Setup per replica group) and a run."""

from __future__ import annotations

from granisim.config.scenario import FleetCfg, Scenario, ScenarioError
from granisim.fleet.replica import ReplicaSpec


def fleet_cfg(scenario: Scenario) -> FleetCfg:
    """The scenario's fleet; a scenario without [fleet] is a fleet of one."""
    return scenario.fleet if scenario.fleet is not None else FleetCfg()


def replica_specs(scenario: Scenario, source: str = "<scenario>") -> list[ReplicaSpec]:
    """One spec per replica; groups in order, each prepared with its profile and policy overrides."""
    from granisim.experiments.run import prepare

    cfg = fleet_cfg(scenario)
    for i, f in enumerate(cfg.faults):
        if f.replica >= cfg.size:
            raise ScenarioError(f"{source}: field fleet.faults.{i}.replica = {f.replica}: the fleet has "
                                f"replicas 0..{cfg.size - 1}")
    groups = cfg.groups or (None,)
    specs: list[ReplicaSpec] = []
    for g, group in enumerate(groups):
        sc, n = scenario, cfg.size
        if group is not None:
            n = group.replicas
        try:
            if group is not None and (group.profile is not None or group.policy is not None):
                sc = _group_scenario(scenario, group, source)
            setup = prepare(sc, source)
        except ScenarioError as err:
            if group is None:
                raise
            raise ScenarioError(_group_error(str(err), g, group)) from None
        first = len(specs)
        specs.extend(ReplicaSpec(first + k, setup, sc.hardware.tp, g) for k in range(n))
    return specs


def _group_scenario(scenario: Scenario, group, source: str) -> Scenario:
    """The scenario as one replica group runs it: its profile and policy in place of the scenario's."""
    from granisim.config.scenario import parse_scenario

    data = scenario.model_dump()
    if group.profile is not None:
        data["hardware"]["profile"] = group.profile
    if group.policy is not None:
        data["policy"]["name"] = group.policy
    return parse_scenario(data, source=source)


def _group_error(msg: str, g: int, group) -> str:
    """A mistake found in replica group ``g``'s scenario, said of the group's field where it is the group's
    own (its profile or policy), else with the group named."""
    where = f"fleet.groups.{g}"
    msg = msg.replace("field hardware.profile", f"field {where}.profile").replace("field policy.name",
                                                                                    f"field {where}.policy")
    if group.policy is not None and "field policy.host_tier = " in msg and f"policy {group.policy} " in msg:
        head, _, rest = msg.partition("field policy.host_tier = ")
        why = rest.partition(": ")[2]
        return f"{head}field {where}.policy = {group.policy!r}: under policy.host_tier = 'slabs', {why}"
    if f"field {where}." in msg:
        return msg
    own = ", ".join(f"{k} {v!r}" for k, v in (("profile", group.profile), ("policy", group.policy)) if v is not None)
    return f"{msg} (in replica group {where}: {own})"


def simulate_fleet(scenario: Scenario, source: str = "<scenario>", make_executor=None, progress: bool = True,
                   keep_outputs: bool = False, trace=None, router=None):
    """Run the fleet (cost-model executors unless ``make_executor(setup)`` says otherwise); ``trace``, if
    given, replaces the prepared one (a Setup whose trace was changed, e.g. repeated by the benchmark);
    ``router`` (a :class:`granisim.fleet.routers.Router`), if given, replaces the scenario's."""
    from dataclasses import replace

    from granisim.costmodel.executor import for_setup
    from granisim.fleet.loop import FleetLoop

    specs = replica_specs(scenario, source)
    if trace is not None:
        specs = [replace(sp, setup=replace(sp.setup, trace=trace)) for sp in specs]
    make = make_executor or for_setup
    return FleetLoop(specs, fleet_cfg(scenario), make, progress=progress, keep_outputs=keep_outputs,
                     router=router).run()


def run_fleet(scenario: Scenario, source: str, out, progress: bool = True, make_executor=None,
              plots: bool = True) -> dict:
    """Simulate a fleet scenario and write its outputs (requests/steps parquet, summary.json, plots, trace)."""
    from granisim.fleet.outputs import write_fleet_outputs

    result = simulate_fleet(scenario, source, make_executor, progress)
    setups = [r.spec.setup for r in result.replicas]

    def common(value, mixed):  # the replicas' one value; where they differ, ``mixed`` (each replica's: summary's)
        values = {value(s) for s in setups}
        return values.pop() if len(values) == 1 else mixed

    meta = dict(scenario=scenario.name, policy=common(lambda s: s.scenario.policy.name, "mixed"),
                model=common(lambda s: s.model.name, "mixed"), profile=common(lambda s: s.profile.name, "mixed"),
                kv_budget_tokens=common(lambda s: s.kv_budget, None), m_sat=common(lambda s: s.m_sat, None),
                seed=scenario.seed, staleness_s=fleet_cfg(scenario).staleness_s)
    return write_fleet_outputs(result, out, meta, plots)


def with_router(scenario: Scenario, router: str) -> Scenario:
    """The scenario with its fleet's router replaced (a scenario without [fleet] becomes a fleet of one)."""
    from granisim.config.scenario import parse_scenario

    data = scenario.model_dump()
    data["fleet"] = dict(data.get("fleet") or {}, router=router)
    return parse_scenario(data, source=f"--routers {router}")


def simulate_setup(setup, executor=None, progress: bool = True):
    """``experiments.run.simulate`` for a fleet scenario: the fleet's run as one SimResult
    (all requests, all replicas' steps by start time); ``executor`` (if given) serves every replica."""
    from granisim.core.serving_loop import SimResult
    from granisim.fleet.outputs import fleet_steps

    make = (lambda _setup: executor) if executor is not None else None
    res = simulate_fleet(setup.scenario, "<scenario>", make, progress, trace=setup.trace)
    steps = fleet_steps(res)
    return SimResult(res.records.requests, _Frame(steps), res.end_s,
                     dict(kv_budget=setup.kv_budget, replicas=len(res.replicas), router=res.router))


class _Frame:
    """Stands in for a StepLog: its frame() is the fleet's steps."""

    def __init__(self, frame):
        self._frame = frame

    def frame(self):
        return self._frame
