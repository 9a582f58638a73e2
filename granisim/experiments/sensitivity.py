"""How far each predicted metric moves when every step takes a few percent longer or shorter.

    granisim run SCENARIO --sensitivity [DELTA]      # DELTA: 0.03 (3%) unless given

The validation runs price single steps within a few percent of the real engine (their per-step target is a 3%
median), but a schedule can amplify that: a short request decoding beside long prefill chunks, or a queue near
saturation, turns 2% per step into 10-20% on a tail (reports/engine/paper_setting/). This simulates the scenario
twice more, with every step's predicted time times 1 - DELTA and 1 + DELTA (``hardware.step_time_scale``), and
reports each summary metric at both, so that a user sees which of the predictions a few percent of step error
can move and by how much. For a fleet it also reports the share of requests each run sends to the replica the
prediction sent them to: a router that decides from live load (`least_load`, `cache_aware`) moves requests when
step times move, and so moves each replica's figures more than the fleet's (reports/fleet/README.md).
Deterministic like the run itself (same seed, same arrivals).
"""

from __future__ import annotations

from pathlib import Path

METRICS = (("throughput_rps", "req/s"), ("output_tok_s", "out tok/s"), ("ttft_p50_s", "TTFT p50"),
           ("ttft_p99_s", "TTFT p99"), ("tpot_p50_s", "TPOT p50"), ("tpot_p99_s", "TPOT p99"),
           ("e2e_p99_s", "E2E p99"), ("completed", "done"), ("preemptions", "preempt"),
           ("same_replica_share", "same repl."))  # fleets: requests on the replica the prediction chose
DEFAULT_DELTA = 0.03


def scaled_scenarios(scenario, source: str, delta: float) -> list[tuple[float, object]]:
    """(factor, ``scenario`` with every step's predicted time times factor, on top of its own
    ``hardware.step_time_scale``) for the factors 1 - delta and 1 + delta (pure). A scaled value beyond the field's
    range: a ScenarioError naming ``source``'s field and ``--sensitivity`` (call it before the base run)."""
    from granisim.config.scenario import MAX_STEP_TIME_SCALE, ScenarioError

    scale = scenario.hardware.step_time_scale
    if scale * (1.0 + delta) > MAX_STEP_TIME_SCALE:
        raise ScenarioError(f"{source}: field hardware.step_time_scale = {scale!r}: --sensitivity {delta:g} would "
                            f"scale it to {scale * (1.0 + delta):g}, above its limit of {MAX_STEP_TIME_SCALE}")
    return [(f, scenario.with_changes(**{"hardware.step_time_scale": scale * f})) for f in (1.0 - delta, 1.0 + delta)]


def scaled_summaries(scenario, source: str, delta: float, replicas: dict[int, int] | None = None) -> dict[float, dict]:
    """factor -> the summary of ``scenario`` with every step's predicted time times factor (1 - delta, 1 + delta,
    on top of its own ``hardware.step_time_scale``); with ``replicas`` (a fleet's prediction: request id -> replica)
    each summary also carries ``same_replica_share``, the share of those requests the run sent to the same
    replica."""
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate

    out = {}
    for f, scaled in scaled_scenarios(scenario, source, delta):
        setup = prepare(scaled, source)
        if scenario.fleet is None:
            res = simulate(setup, progress=False)
            out[f] = summarize(requests_frame(res.records), res.steps.frame(), res.end_s)
            continue
        from granisim.fleet.build import simulate_fleet
        from granisim.fleet.outputs import fleet_requests, fleet_steps

        res = simulate_fleet(setup.scenario, source, progress=False, trace=setup.trace)
        reqs = fleet_requests(res)
        out[f] = summarize(reqs, fleet_steps(res), res.end_s)
        if replicas:
            out[f]["same_replica_share"] = same_replica_share(replicas, reqs)
    return out


def replica_of(requests) -> dict[int, int]:
    """Request id -> the replica that served it, from a fleet's requests frame (empty for one GPU) (pure)."""
    if "replica" not in requests:
        return {}
    return dict(zip(requests["rid"].tolist(), requests["replica"].tolist()))


def same_replica_share(replicas: dict[int, int], requests) -> float:
    """The share of ``replicas``' requests that ``requests`` (a requests frame) shows on the same replica (pure)."""
    now = replica_of(requests)
    return sum(now.get(rid) == r for rid, r in replicas.items()) / len(replicas)


def rows(base: dict, scaled: dict[float, dict]) -> list[dict]:
    """Per metric: the prediction, its value at each factor and the change against the prediction (pure)."""
    out = []
    for key, label in METRICS:
        if key not in base:
            continue
        row = {"metric": key, "label": label, "predicted": base[key], "at": {}}
        for f, s in sorted(scaled.items()):
            v = s[key]
            change = (v - base[key]) / base[key] if base[key] and base[key] == base[key] and v == v else None
            row["at"][f"{f:g}"] = {"value": v, "change": change}
        out.append(row)
    return out


def format_table(table: list[dict], delta: float) -> str:
    def val(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    def cell(a: dict) -> str:
        return val(a["value"]) + (f" ({a['change']:+.1%})" if a["change"] is not None else "")

    factors = list(table[0]["at"]) if table else []
    head = f"{'metric':<10}{'predicted':>12}" + "".join(f"{'steps x' + f:>22}" for f in factors)
    lines = [f"sensitivity: every step's time x (1 -+ {delta:g}), the same arrivals", head, "-" * len(head)]
    for r in table:
        lines.append(f"{r['label']:<10}{val(r['predicted']):>12}" + "".join(f"{cell(a):>22}" for a in r["at"].values()))
    return "\n".join(lines)


def write(out: Path, table: list[dict], delta: float) -> None:
    from granisim.core.metrics import strict_json

    (out / "sensitivity.json").write_text(strict_json({"delta": delta, "rows": table}, indent=2) + "\n")
