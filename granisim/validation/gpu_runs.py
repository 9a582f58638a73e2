"""Real-engine runs on a GPU: validation (predicted vs measured) and real speedups.

Resumable: every finished unit writes one JSON under --out; units already present in
--out or in --done (a folder of earlier results carried with the working tree) are
skipped, so a device call that stops early loses only the unit in flight.

    granisim validation gpu-run speedup --out $OUT --done DONE --budget-s 480
    granisim validation gpu-run validate --out $OUT --budget-s 480
    granisim validation gpu-run speedup --out $OUT --profile h200-engine --policies granikv-auto token paged16

Needs torch + triton + a CUDA GPU, and simpy/pydantic (carry them as wheels to the device).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

POLICIES = ("granikv", "token", "paged16")
SPEEDUP_GRID = [(lp, k) for lp in (16384, 4096, 1024) for k in (1, 4, 16)]  # longest first: a cut-short second pass repeats those
VALIDATION = {
    "multi_agent_16k": {"workload": {"roles": 4, "prefix_len": 16384, "num_requests": 96, "rate": 6.0}},
    "control_short": {"workload": {"kind": "control", "roles": 4, "prefix_len": 64, "num_requests": 96,
                                   "rate": 6.0}},
    "azure_replay": {"workload": {"kind": "azure", "arrivals": "trace", "num_requests": 150}},
}


def _scenario(extra: dict, profile: str):
    from granisim.config.scenario import parse_scenario

    base = {"name": "engine", "seed": 0, "model": {"name": "llama-3.1-8b"},
            "hardware": {"profile": profile, "mem_fraction": 0.85},
            "workload": {"max_output_len": 128}}
    for sect, vals in extra.items():
        base.setdefault(sect, {}).update(vals) if isinstance(vals, dict) else base.update({sect: vals})
    return parse_scenario(base)


def burst_scenario(pol: str, lp: int, k: int, requests: int, profile: str):
    """A speedup unit's scenario: `requests` arriving at once (throughput at saturation). `pol` is a
    policy name, or NAME-DISPATCH for a policy with another prefix-path dispatch (granikv-auto)."""
    name, _, dispatch = pol.partition("-")
    policy = {"name": name, **({"dispatch": dispatch} if dispatch else {})}
    return _scenario({"policy": policy, "workload": {"roles": k, "prefix_len": lp, "num_requests": requests,
                                                      "rate": 1000.0}}, profile)


def validation_scenario(name: str, requests: int, profile: str):
    """A validation workload's scenario, capped at `requests` requests."""
    extra = VALIDATION[name]
    wl = {**extra["workload"], "num_requests": min(extra["workload"]["num_requests"], requests)}
    return _scenario({**extra, "workload": wl}, profile)


def _free_gpu() -> None:
    """Drop the last unit's executor (its KV buffers take most of the GPU) before the next one."""
    import gc

    import torch

    gc.collect()  # the engine's SimPy processes hold the executor in reference cycles
    torch.cuda.empty_cache()


def _done(name: str, out: Path, done: Path | None) -> bool:
    return (out / f"{name}.json").exists() or (done is not None and (done / f"{name}.json").exists())


def _burst(pol: str, lp: int, k: int, requests: int, profile: str, graphs: bool, hold_gc: bool = True):
    """One speedup unit on the GPU -> (executor, result)."""
    from gpu_backend.executor import for_setup as gpu_executor
    from granisim.experiments.run import prepare, simulate

    setup = prepare(burst_scenario(pol, lp, k, requests, profile))
    _free_gpu()
    ex = gpu_executor(setup, "cuda", graphs=graphs, hold_gc=hold_gc)
    return ex, simulate(setup, ex, progress=False)


def _warm_up(profile: str, graphs: bool) -> None:
    """Small unmeasured units first: the process's first launches of each kernel variant load or
    build it (Triton), and in an eager step that time would be counted as the step's."""
    t = time.time()
    for pol in POLICIES:
        _burst(pol, 1024, 4, 16, profile, graphs)
    _free_gpu()
    print(f"warm-up: {time.time() - t:.1f} s", flush=True)


def speedup(args) -> None:
    from granisim.core.metrics import requests_frame, summarize

    t0 = time.time()
    grid = [tuple(int(x) for x in p.split(",")) for p in args.only] if args.only else SPEEDUP_GRID
    warm = False
    for rep, lp, k, pol in ((r, lp, k, p) for r in range(args.reps) for lp, k in grid for p in args.policies):
        name = (f"speedup_lp{lp}_k{k}_{pol}" + ("_eager" if args.eager else "") + ("_gc" if args.gc_in_steps else "")
                + (f"_rep{rep}" if rep else ""))
        if _done(name, args.out, args.done):
            continue
        if time.time() - t0 > args.budget_s:
            print(f"budget reached; stopping before {name}")
            return
        if not warm:
            _warm_up(args.profile, not args.eager)
            warm = True
        ex = res = None  # the last unit's KV buffers and graphs go before the next unit's are made
        t = time.time()
        ex, res = _burst(pol, lp, k, args.requests, args.profile, not args.eager, not args.gc_in_steps)
        steps = res.steps.frame()
        s = summarize(requests_frame(res.records), steps, res.end_s)
        dec = steps[steps.prefill_tokens == 0]
        s.update(lp=lp, k=k, policy=pol, wall_s=time.time() - t, graphs=not args.eager, executor=ex.stats(),
                 breakdown_s={c[2:]: float(steps[c].sum()) for c in steps.columns if c.startswith("t_")},
                 decode_only_steps=int(len(dec)), decode_step_ms_p50=float(dec.duration_s.median() * 1e3),
                 decode_breakdown_ms_p50={c[2:]: float(dec[c].median() * 1e3) for c in dec.columns
                                          if c.startswith("t_")})
        (args.out / f"{name}.json").write_text(json.dumps(s, indent=2))
        steps.to_parquet(args.out / f"{name}_steps.parquet", index=False)
        print(f"{name}: {s['throughput_rps']:.3f} req/s, TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms", flush=True)


def validate_all(args) -> None:
    from gpu_backend.executor import for_setup as gpu_executor
    from granisim.experiments.run import prepare
    from granisim.validation.validate import validate

    t0 = time.time()
    tag = ("_gc" if args.gc_in_steps else "") + (f"_g{args.graph_max_rows}" if args.graph_max_rows else "")
    for name in VALIDATION:
        if args.only and name not in args.only:
            continue
        if _done(f"validation_{name}{tag}", args.out, args.done) or time.time() - t0 > args.budget_s:
            continue
        setup = prepare(validation_scenario(name, args.requests, args.profile))
        ex = None
        _free_gpu()
        ex = gpu_executor(setup, "cuda", hold_gc=not args.gc_in_steps,
                           **({"graph_max_rows": args.graph_max_rows} if args.graph_max_rows else {}))
        rep = validate(setup, ex, args.out / (name + tag), progress=False)
        rep["executor"] = ex.stats()
        (args.out / f"validation_{name}{tag}.json").write_text(json.dumps(rep, indent=2))
        print(name, json.dumps(rep["step_errors"]["total"]), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="granisim validation gpu-run", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["speedup", "validate"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--done", type=Path)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--only", nargs="*", help="speedup points as LP,K / validation names (default: all)")
    ap.add_argument("--requests", type=int,
                    help="speedup: requests per burst (default 64); validate: each workload's cap (default 96, "
                         "its own size: at 64 the multi-agent TPOT p50 is ill-conditioned)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (every step launched eagerly)")
    ap.add_argument("--gc-in-steps", action="store_true",
                    help="let Python's garbage collector run inside timed steps (the engine's old behaviour; "
                         "outputs get a _gc suffix)")
    ap.add_argument("--graph-max-rows", type=int,
                    help="validate: the executor's CUDA-graph limit (default: the executor's; outputs get _gN)")
    ap.add_argument("--policies", nargs="*", default=list(POLICIES),
                    help="speedup: policies, NAME or NAME-DISPATCH (e.g. granikv-auto)")
    ap.add_argument("--reps", type=int, default=1, help="speedup: passes over the grid (rep r > 0 adds _repR)")
    args = ap.parse_args(argv)
    if args.requests is None:
        args.requests = 64 if args.what == "speedup" else 96
    args.out.mkdir(parents=True, exist_ok=True)
    (speedup if args.what == "speedup" else validate_all)(args)


if __name__ == "__main__":
    main()
