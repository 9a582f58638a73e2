"""Real-engine runs on a GPU: validation (predicted vs measured) and real speedups.

Validation units are WORKLOAD_POLICY_MODEL (every workload of VALIDATION under every --policies on every
--models); trace-timed runs wait out the gaps between arrivals (--no-idle: back to back, suffix _noidle).
Resumable: every finished unit writes one JSON under --out; units already present in
--out or in --done (a folder of earlier results carried with the working tree) are
skipped, so a device call that stops early loses only the unit in flight.

    granisim validation gpu-run speedup --out $OUT --done DONE --budget-s 480
    granisim validation gpu-run validate --out $OUT --budget-s 480 [--models llama-3.1-8b qwen-2.5-14b]
        [--policies granikv token paged16] [--no-idle] [--log-gpu]
    granisim validation gpu-run speedup --out $OUT --profile h200-engine --policies granikv-auto token paged16
    granisim validation gpu-run paper --out $OUT --reps 3 [--only 16384 4096]   # the paper's setting (PAPER)

Needs torch + triton + a CUDA GPU, and simpy/pydantic (carry them as wheels to the device).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime
from pathlib import Path

from granisim.validation.host_probe import probe as host_probe  # the host's speed, before each unit
from granisim.config.files import OneLineParser

ROOT = Path(__file__).resolve().parents[2]

POLICIES = ("granikv", "token", "paged16")
SPEEDUP_GRID = [(lp, k) for lp in (16384, 4096, 1024) for k in (1, 4, 16)]  # longest first: a cut-short second pass repeats those
VALIDATION = {
    "multi_agent_16k": {"workload": {"roles": 4, "prefix_len": 16384, "num_requests": 96, "rate": 6.0}},
    "control_short": {"workload": {"kind": "control", "roles": 4, "prefix_len": 64, "num_requests": 96,
                                   "rate": 6.0}},
    "azure_replay": {"workload": {"kind": "azure", "arrivals": "trace", "num_requests": 150}},
    # long prompts (arXiv summarization lengths, 2.6K tokens on average) at the Azure trace's arrival times
    "arxiv_replay_150": {"workload": {"kind": "azure", "lengths_trace": "arxiv", "num_requests": 150}},
    "arxiv_replay_500": {"workload": {"kind": "azure", "lengths_trace": "arxiv", "num_requests": 500},
                         "held_out": True},
    # multi-turn sessions: 3 turns, 2 s mean think time; num_requests counts sessions (50 x 3 = 150 requests)
    "multi_turn_150": {"workload": {"roles": 4, "prefix_len": 8192, "num_requests": 50, "rate": 2.0, "turns": 3,
                                    "think_time_s": 2.0}},
    "multi_turn_500": {"workload": {"roles": 4, "prefix_len": 8192, "num_requests": 167, "rate": 4.0, "turns": 3,
                                    "think_time_s": 2.0}},
}
HELD_OUT = tuple(n for n, w in VALIDATION.items() if w.get("held_out"))  # never in a fit; reported on its own
MODELS = ("llama-3.1-8b", "qwen-2.5-14b")
GPU_LOG_QUERY = "timestamp,power.draw,power.limit,clocks.sm,clocks.mem,temperature.gpu,clocks_throttle_reasons.active"


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


# The paper's setting on the real engine (issue: kernels at the floor): Poisson arrivals above granikv's capacity,
# ShareGPT-like outputs, 4 roles. Rates: 1.5x the simulated granikv capacity on h200 at each prefix length when the
# setting was fixed (2026-12-04 kernels), kept so that runs compare across kernel changes;
# output_scale 1.184 makes the bundled Azure trace's outputs average 249 tokens (ShareGPT's mean is about 250).
PAPER_RATES = {16384: 9.7, 4096: 15.7}
PAPER = {"roles": 4, "num_requests": 200, "output_scale": 1.184, "max_output_len": 2048}


def paper_scenario(pol: str, lp: int, profile: str, requests: int | None = None):
    """A paper-setting unit's scenario: ``PAPER`` at ``PAPER_RATES[lp]`` under policy ``pol`` (NAME or NAME-DISPATCH)."""
    name, _, dispatch = pol.partition("-")
    wl = {**PAPER, "prefix_len": lp, "rate": PAPER_RATES[lp], **({"num_requests": requests} if requests else {})}
    return _scenario({"policy": {"name": name, **({"dispatch": dispatch} if dispatch else {})}, "workload": wl}, profile)


def validation_scenario(name: str, requests: int | None, profile: str, policy: str = "granikv",
                        model: str = "llama-3.1-8b"):
    """A validation workload's scenario under `policy` (NAME or NAME-DISPATCH) and `model`, capped at
    `requests` requests (None: the workload's own size)."""
    extra = {k: v for k, v in VALIDATION[name].items() if k != "held_out"}
    n = extra["workload"]["num_requests"]
    wl = {**extra["workload"], "num_requests": n if requests is None else min(n, requests)}
    pname, _, dispatch = policy.partition("-")
    return _scenario({**extra, "workload": wl, "policy": {"name": pname, **({"dispatch": dispatch} if dispatch else {})},
                      "model": {"name": model}}, profile)


def unit_name(workload: str, policy: str, model: str) -> str:
    """A validation unit's output name: workload, policy and model (validation_NAME.json and folder NAME)."""
    return f"{workload}_{policy}_{model}"


def split_unit(name: str) -> tuple[str, str, str] | None:
    """(workload, policy, model) of a unit name written by :func:`unit_name` (a tag such as _gc may follow);
    an older run's bare workload name reads as granikv on llama-3.1-8b; None if no workload matches."""
    for w in sorted(VALIDATION, key=len, reverse=True):
        if name == w:
            return w, "granikv", "llama-3.1-8b"
        if name.startswith(w + "_"):
            rest = name[len(w) + 1:]
            for m in sorted(MODELS, key=len, reverse=True):
                pol, sep, tail = rest.partition("_" + m)
                if sep and (not tail or tail.startswith("_")):
                    return w, pol, m
            return w, "granikv", "llama-3.1-8b"
    return None


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


def _pending(units, args, graphs: bool):
    """The ``(name, ...)`` units not yet done under --out or --done, in order, until --budget-s has passed; the
    kernels are warmed up once, before the first unit that runs."""
    t0, warm = time.time(), False
    for unit in units:
        if _done(unit[0], args.out, args.done):
            continue
        if time.time() - t0 > args.budget_s:
            print(f"budget reached; stopping before {unit[0]}")
            return
        if not warm:
            _warm_up(args.profile, graphs)
            warm = True
        yield unit


def speedup(args) -> None:
    from granisim.core.metrics import requests_frame, summarize

    grid = [tuple(int(x) for x in p.split(",")) for p in args.only] if args.only else SPEEDUP_GRID
    units = ((f"speedup_lp{lp}_k{k}_{pol}" + ("_eager" if args.eager else "") + ("_gc" if args.gc_in_steps else "")
              + (f"_rep{r}" if r else ""), lp, k, pol)
             for r in range(args.reps) for lp, k in grid for pol in args.policies)
    for name, lp, k, pol in _pending(units, args, not args.eager):
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


def paper(args) -> None:
    """The paper's setting (``PAPER``) at each prefix length of PAPER_RATES (or --only), every policy within each
    repetition in turn (so a drift of the machine between repetitions falls on every policy alike)."""
    from gpu_backend.executor import for_setup as gpu_executor
    from granisim.core.metrics import requests_frame, summarize
    from granisim.experiments.run import prepare, simulate

    lps = [int(x) for x in args.only] if args.only else sorted(PAPER_RATES, reverse=True)
    unknown = [lp for lp in lps if lp not in PAPER_RATES]
    if unknown:
        raise ValueError(f"--only {unknown[0]}: the paper's setting is defined at L_p = "
                         f"{', '.join(map(str, sorted(PAPER_RATES)))}")
    units = ((f"paper_lp{lp}_{pol}_rep{r}", r, lp, pol) for r in range(args.reps) for lp in lps for pol in args.policies)
    for name, rep, lp, pol in _pending(units, args, True):
        ex = res = None
        host = host_probe()
        t = time.time()
        setup = prepare(paper_scenario(pol, lp, args.profile, args.requests))
        _free_gpu()
        ex = gpu_executor(setup, "cuda")
        res = simulate(setup, ex, progress=False)
        steps = res.steps.frame()
        s = summarize(requests_frame(res.records), steps, res.end_s)
        s.update(lp=lp, policy=pol, rep=rep, rate=PAPER_RATES[lp], wall_s=time.time() - t, executor=ex.stats(),
                 mean_batch=float(steps.batch.mean()), host_probe=host, host_probe_after=host_probe())
        (args.out / f"{name}.json").write_text(json.dumps(s, indent=2))
        steps.to_parquet(args.out / f"{name}_steps.parquet", index=False)  # per-step parts, for the cost model
        print(f"{name}: {s['throughput_rps']:.3f} req/s, TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms", flush=True)


def validate_all(args) -> None:
    from gpu_backend.executor import for_setup as gpu_executor
    from granisim.experiments.run import prepare
    from granisim.validation.validate import validate

    t0 = time.time()
    tag = ("_gc" if args.gc_in_steps else "") + (f"_g{args.graph_max_rows}" if args.graph_max_rows else "") + \
          ("_noidle" if args.no_idle else "") + (f"_tp{args.tp}" if args.tp > 1 else "")
    for model in args.models:
        for name in VALIDATION:
            for pol in args.policies:
                if args.only and name not in args.only:
                    continue
                unit = unit_name(name, pol, model) + tag
                if _done(f"validation_{unit}", args.out, args.done):
                    continue
                if time.time() - t0 > args.budget_s:
                    print(f"budget reached; stopping before {unit}", flush=True)
                    return
                host = host_probe()  # the host's speed this minute, before the unit (validation/host_probe.py)
                t, started = time.time(), datetime.now().isoformat(timespec="milliseconds")
                sc = validation_scenario(name, args.requests, args.profile, pol, model)
                setup = prepare(sc.with_changes(**{"hardware.tp": args.tp}) if args.tp > 1 else sc)
                ex = None
                _free_gpu()
                if args.tp > 1:  # the replica's ranks, one process a GPU (gpu_backend/executor/tp.py)
                    from gpu_backend.executor.tp import validate_replica

                    validate_replica(setup, args.out / unit, "cuda", unit, progress=False, idle=not args.no_idle)
                    rep = json.loads((args.out / unit / "validation.json").read_text())
                else:
                    ex = gpu_executor(setup, "cuda", hold_gc=not args.gc_in_steps,
                                      **({"graph_max_rows": args.graph_max_rows} if args.graph_max_rows else {}))
                    rep = validate(setup, ex, args.out / unit, progress=False, idle=not args.no_idle)
                    rep["executor"] = ex.stats()
                # local start/end times: the unit's window in OUT/gpu_log.csv (--log-gpu; gpu_log.log_summary)
                wall, ended = time.time() - t, datetime.now().isoformat(timespec="milliseconds")
                # probed again after the unit: does a probe beside the unit tell the host's speed during it (its
                # steps' host_between_s, reports/validation/host_loop/)?
                rep.update(workload=name, held_out=name in HELD_OUT, wall_s=wall, host_probe=host,
                           host_probe_after=host_probe(), started_local=started, ended_local=ended)
                (args.out / f"validation_{unit}.json").write_text(json.dumps(rep, indent=2))
                print(unit, f"{time.time() - t:.0f} s", json.dumps(rep["step_errors"]["total"]), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation gpu-run", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["speedup", "validate", "paper"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--done", type=Path)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--only", nargs="*",
                    help="speedup points as LP,K / validation names / paper prefix lengths (default: all)")
    ap.add_argument("--requests", type=int,
                    help="speedup: requests per burst (default 64); validate: each workload's cap (default: "
                         "its own size; at 64 the multi-agent TPOT p50 is ill-conditioned)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (every step launched eagerly)")
    ap.add_argument("--tp", type=int, default=1, choices=(1, 2, 4, 8),
                    help="validate: tensor-parallel replicas of this many GPUs (units tagged _tpN; eager steps)")
    ap.add_argument("--gc-in-steps", action="store_true",
                    help="let Python's garbage collector run inside timed steps (the engine's old behaviour; "
                         "outputs get a _gc suffix)")
    ap.add_argument("--graph-max-rows", type=int,
                    help="validate: the executor's CUDA-graph limit (default: the executor's; outputs get _gN)")
    ap.add_argument("--policies", nargs="*", default=list(POLICIES),
                    help="policies, NAME or NAME-DISPATCH (e.g. granikv-auto); default: granikv token paged16")
    ap.add_argument("--models", type=_models, nargs="+",
                    help=f"validate: models, space- or comma-separated (default {' '.join(MODELS)}; the first runs "
                         "first)")
    ap.add_argument("--no-idle", action="store_true",
                    help="validate: run steps back to back instead of waiting out the gaps between arrivals "
                         "(outputs get a _noidle suffix)")
    ap.add_argument("--log-gpu", action="store_true",
                    help="log clocks, power and temperature (read-only nvidia-smi, every 100 ms) to OUT/gpu_log.csv")
    ap.add_argument("--reps", type=int, default=1,
                    help="speedup, paper: passes over the grid (speedup: rep r > 0 adds _repR; paper: every unit _repR)")
    args = ap.parse_args(argv)
    args.models = [m for names in args.models for m in names] if args.models else list(MODELS)
    if args.requests is None and args.what == "speedup":
        args.requests = 64
    args.out.mkdir(parents=True, exist_ok=True)
    from granisim.validation.gpu_log import GpuLog

    with GpuLog(args.out / "gpu_log.csv", enabled=args.log_gpu):
        {"speedup": speedup, "validate": validate_all, "paper": paper}[args.what](args)


def _models(text: str) -> list[str]:
    from granisim.config.models import MODELS as KNOWN

    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in KNOWN]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown model {bad[0] if bad else text!r} (known: {', '.join(sorted(KNOWN))})")
    return names


if __name__ == "__main__":
    main()
