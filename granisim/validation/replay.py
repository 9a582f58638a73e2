"""TPOT on the measured schedule: is a TPOT error the cost model's or the schedule's?

    granisim validation replay RAW/validation/runA1 RAW/validation/runA2 [--profile h200-engine]
        [--policy granikv] [--model llama-3.1-8b]

For each validation run and workload, the stored plans are priced with PROFILE step by step and
each request's TPOT is recomputed on the measured schedule (the same steps, in the same order,
each lasting its predicted instead of its measured time). Beside the measured TPOT
p50 and p99 this isolates the cost model's error; what the simulator adds beyond it, running the
scenario on its own clock, is the schedule's (validation_runs.py shows how sensitive that is).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]

from granisim.config.hardware import get_profile
from granisim.config.models import get_model
from granisim.validation.validate import reprice
from granisim.validation.report import _load
from granisim.config.files import OneLineParser


def tpots(plans, durations: np.ndarray, prompt_len: dict[int, int]) -> np.ndarray:
    """Every request's TPOT with step i lasting durations[i]. A request yields a token in each step that covers its
    prompt's end (its last prefill chunk, then every decode step); the engine never idles while a request
    is running, so step ends are the running sum of the durations."""
    end = np.cumsum(durations)
    first, last, count = {}, {}, {}
    for i, plan in enumerate(plans):
        for r in plan.requests:
            if r.context_len + r.num_new < prompt_len[r.rid]:
                continue
            first.setdefault(r.rid, end[i])
            last[r.rid] = end[i]
            count[r.rid] = count.get(r.rid, 0) + 1
    return np.array([(last[k] - first[k]) / (count[k] - 1) for k in count if count[k] > 1])


def tpot_percentiles(plans, durations: np.ndarray, prompt_len: dict[int, int]) -> tuple[float, float]:
    """TPOT p50 and p99, percentiles as granisim.core.metrics takes them."""
    return tuple(float(x) for x in np.percentile(tpots(plans, durations, prompt_len), [50, 99]))


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run folders holding h200_run/<workload>/")
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--policy", default="granikv")
    ap.add_argument("--model", default="llama-3.1-8b")
    args = ap.parse_args(argv)
    prof, model = get_profile(args.profile), get_model(args.model)
    print(f"| run | workload | TPOT p50 measured | on the measured schedule, {args.profile} "
          f"| TPOT p99 measured | on the measured schedule, {args.profile} |")
    print("|---|---|---|---|---|---|")
    for run in args.runs:
        if not (run / "h200_run").is_dir():
            raise ValueError(f"{run}: no such run folder (with h200_run/ in it)")
    for run in args.runs:
        names, runs_steps, runs_plans = _load(run / "h200_run", args.policy, args.model)
        if not names:
            raise ValueError(f"{run / 'h200_run'}: no unit of {args.policy} on {args.model} in it")
        for w in names:
            plans = runs_plans[w]
            steps = reprice(runs_steps[w], plans, prof, model)
            reqs = pd.read_parquet(run / "h200_run" / w / "measured_requests.parquet")
            plen = dict(zip(reqs.rid, reqs.prompt_len))
            measured = tpot_percentiles(plans, steps.measured_s.to_numpy(float), plen)
            priced = tpot_percentiles(plans, steps.predicted_s.to_numpy(float), plen)
            cells = [f"{m * 1e3:.2f} ms | {p * 1e3:.2f} ms ({(p / m - 1) * 100:+.1f}%)" for m, p in zip(measured, priced)]
            print(f"| {run.name} | {w} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
