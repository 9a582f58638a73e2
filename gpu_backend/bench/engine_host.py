"""The real engine's decode step with its host path as committed and as of an earlier commit, side by side on
one GPU, in one process: the step's time and its host part ("overhead": the step's clock outside its GPU parts).

    python -m gpu_backend.bench.engine_host --before DIR --out OUT [--policies granikv token] [--reps 3]
        [--lp 16384] [--k 4] [--requests 64] [--probe] [--budget-s 400]

DIR holds the earlier commit's `rows.py`, `arena.py`, `metadata.py` and `executor.py` of gpu_backend/executor
(`git show BASE:gpu_backend/executor/NAME.py > DIR/NAME.py`); they are loaded beside the package and run with its
other modules (graphs, launches, kernels, timing, and the request table's `request_table.py` / `rows_repeat.py`), so
the two variants differ in their host path alone: take BASE from before the request table (61d2ec5), whose rows.py
used neither, or compare within this code with `listed` / `current`. `--before
listed` compares against this code with the request table off (every decode id listed each step), no folder needed;
`--before current` against this code itself; `--before-option` / `--after-option NAME=VALUE ...` build either side's
executor with other options (e.g. `--before current --after-option small_in_graph=True`: a graph step's fixed-size
metadata copied by the graph's first node instead of a copy the host launches). Each unit
is the speedup grid's burst (`granisim validation gpu-run speedup`: `requests` requests at once over `k` roles'
`lp`-token prefixes, Llama-3.1-8B, CUDA graphs up to 2048 rows) served by one variant; repetition r runs every
policy under both variants, in alternating order (before first in even repetitions), after one warm-up of small
units under both. Per unit: the decode-only steps' median time and median host part, over all decode steps (as
reports/engine/speedups.json takes them) and over those of the whole burst (B = `requests`).

`--probe` adds one repetition whose steps also record the host's wall-clock time in `rows.build`,
`metadata.upload`, the graph lookup and `graph.replay()` (a wrapper each, a microsecond or two), and, after each
B = `requests` graph step, replays that step's graph 10 more times alone: the host time of `replay()` and the
device's wait from an event recorded before it to the graph's first node. Needs a CUDA GPU, torch and triton, and
simpy/pydantic. Prints a table; writes OUT/engine_host.json (per unit, the replays alone as their spread over the
steps: the report's summary) and, per step, OUT/steps.csv and OUT/alone.csv (raw: kept outside git).
"""
from __future__ import annotations

import argparse
import ast
import csv
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from .host_work import code_commit

NAMES = ("rows", "arena", "metadata", "executor")


def load_before(folder: Path):
    """The earlier commit's executor module, wired to its own rows/arena/metadata (the rest: this package's)."""
    mods = {}
    for name in NAMES:
        spec = importlib.util.spec_from_file_location(f"gpu_backend.executor._before_{name}", folder / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    ex = mods["executor"]
    ex.rows, ex.metadata, ex.MetaArena = mods["rows"], mods["metadata"], mods["arena"].MetaArena
    return ex


def _free_gpu() -> None:
    import torch

    gc.collect()  # the serving loop's SimPy processes hold the executor in reference cycles
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Probe:
    """Host phases of each step (wrappers around the executor module's rows.build / metadata.upload and the graph
    cache's lookup / replay), and replays of full-batch graph steps alone."""

    def __init__(self, module, ex, requests: int, replays: int = 10):
        import torch

        self.torch = torch
        self.module, self.ex, self.requests, self.replays = module, ex, requests, replays
        self.saved = (module.rows, module.metadata)
        self.phases: dict[str, float] = {}
        self.alone: list[dict] = []
        module.rows = SimpleNamespace(**{**vars(module.rows), "build": self._timed("build", module.rows.build)})
        module.metadata = SimpleNamespace(**{**vars(module.metadata),
                                             "upload": self._timed("upload", module.metadata.upload)})
        g = ex.graphs
        g.lookup = self._timed("lookup", g.lookup)
        g.replay = self._timed("replay", g.replay)

    def _timed(self, name, fn):
        def wrapped(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t
        return wrapped

    def start(self) -> None:
        self.phases = {}

    def after(self, plan, replayed: bool) -> None:
        """Replay a full-batch decode step's graph alone (its metadata is still in the arena: the same inputs, the
        same K/V to the same slots)."""
        torch = self.torch
        if not replayed or len(plan.requests) != self.requests or any(r.is_prefill for r in plan.requests):
            return
        try:
            entry = self.ex.graphs.last
            first = entry.timer._marks[0][1]  # the graph's first event-record node (before the embedding)
            host, wait = [], []
            for _ in range(self.replays):
                torch.cuda.synchronize()
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                t = time.perf_counter()
                entry.graph.replay()
                host.append(time.perf_counter() - t)
                torch.cuda.synchronize()
                wait.append(ev.elapsed_time(first) / 1e3)
            self.alone.append({"step": plan.step, "host_replay_s": statistics.median(host),
                               "first_node_wait_s": statistics.median(wait), "timer_events": len(entry.timer._marks)})
        except Exception as e:  # a diagnostic: never lose the unit over it
            self.alone.append({"step": plan.step, "error": repr(e)})

    def close(self) -> None:
        self.module.rows, self.module.metadata = self.saved


def scenario(policy: str, lp: int, k: int, requests: int, profile: str, smoke: bool):
    """The speedup grid's burst (`smoke`: the tiny model on a small KV budget, for a CPU check of this script)."""
    from granisim.config.scenario import parse_scenario
    from granisim.validation.gpu_runs import burst_scenario

    if not smoke:
        return burst_scenario(policy, lp, k, requests, profile)
    return parse_scenario({"name": "smoke", "seed": 0, "model": {"name": "tiny"},
                           "hardware": {"kv_budget_tokens": 4096}, "policy": {"name": policy},
                           "workload": {"roles": k, "prefix_len": lp, "num_requests": requests, "rate": 1000.0,
                                        "suffix_scale": 0.02, "max_output_len": 6}})


def run_unit(variant, sc, requests: int, probe: bool, device: str) -> tuple[list, dict]:
    """One burst (scenario `sc`) served by a variant's GpuExecutor (`variant`: its executor module and the options
    the executor is built with) -> (per-step records, executor stats and probe figures)."""
    module, options = variant
    from granisim.experiments.run import prepare, simulate

    setup = prepare(sc)
    _free_gpu()
    ex = module.GpuExecutor(setup.model, setup.kv_budget, device=device, seed=setup.scenario.seed, **options)
    records = []
    p = Probe(module, ex, requests) if probe and ex.graphs is not None else None
    if p is not None:  # remember which graph a replay ran (GraphCache.replay's argument)
        replay = ex.graphs.replay

        def remember(entry):
            ex.graphs.last = entry
            return replay(entry)

        ex.graphs.replay = remember
    execute = ex.execute

    def recorded(plan):
        replays = ex.graphs.replays if ex.graphs is not None else 0
        if p is not None:
            p.start()
        res = execute(plan)
        replayed = ex.graphs is not None and ex.graphs.replays != replays
        rec = {"step": plan.step, "batch": len(plan.requests), "prefill_tokens": sum(r.num_new for r in plan.requests
                                                                                     if r.is_prefill),
               "graph": replayed, "duration_s": res.duration_s, **{f"t_{k}": v for k, v in res.breakdown.items()}}
        if p is not None:
            rec.update({f"host_{k}_s": v for k, v in p.phases.items()})
            p.after(plan, replayed)
        records.append(rec)
        return res

    ex.execute = recorded
    try:
        simulate(setup, ex, progress=False)
    finally:
        if p is not None:
            p.close()
    extra = {"executor": ex.stats()}
    if p is not None:
        extra["alone"] = p.alone  # per step: main() writes them to alone.csv and keeps their spread in the JSON
    del ex
    _free_gpu()
    return records, extra


def summarize(records: list[dict], requests: int) -> dict:
    dec = [r for r in records if r["prefill_tokens"] == 0]
    out = {}
    for name, sel in (("decode", dec), ("decode_full", [r for r in dec if r["batch"] == requests])):
        if not sel:
            continue
        ov = [r.get("t_overhead", 0.0) for r in sel]
        out[name] = {"steps": len(sel), "graph_steps": sum(r["graph"] for r in sel),
                     "step_ms_p50": statistics.median(r["duration_s"] for r in sel) * 1e3,
                     "overhead_ms_p50": statistics.median(ov) * 1e3,
                     "overhead_ms_p10": _q(ov, 0.1) * 1e3, "overhead_ms_p90": _q(ov, 0.9) * 1e3,
                     "gpu_ms_p50": statistics.median(r["duration_s"] - r.get("t_overhead", 0.0) for r in sel) * 1e3}
        phases = sorted({k for r in sel for k in r if k.startswith("host_")})
        if phases:
            out[name]["host_us_p50"] = {k[5:-2]: statistics.median(r.get(k, 0.0) for r in sel) * 1e6 for k in phases}
    return out


def _q(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _gpu_state() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gpu_backend.bench.engine_host", description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="folder of the earlier rows/arena/metadata/executor.py, "
                    "`listed`: this code with every decode id listed each step (no request table), or `current`: "
                    "this code (with --before-option)")
    ap.add_argument("--before-option", nargs="+", type=_option, default=[], metavar="NAME=VALUE",
                    help="with --before current or listed: GpuExecutor options of the before variant")
    ap.add_argument("--after-option", nargs="+", type=_option, default=[], metavar="NAME=VALUE",
                    help="GpuExecutor options of the after variant (this code)")
    ap.add_argument("--out", type=Path, default=Path("out/engine_host"))
    ap.add_argument("--policies", nargs="+", default=["granikv", "token"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lp", type=int, default=16384)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--profile", default="auto", help="the scenario's hardware profile (its KV budget; auto: "
                    "h200-engine on an H200, h100-sxm on an H100)")
    ap.add_argument("--probe", action="store_true", help="one more repetition with host phases and replays alone")
    ap.add_argument("--probe-policies", nargs="+", default=["granikv"])
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no unit after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="the tiny model on the CPU (run with TRITON_INTERPRET=1): a "
                    "check of this script, no measurement")
    args = ap.parse_args(argv)
    import torch
    import triton

    from gpu_backend.executor import executor as after
    from granisim.validation.host_probe import probe as host_probe

    if str(args.before) in ("listed", "current"):
        options = {"request_table": False} if str(args.before) == "listed" else {}
        before = (after, {**options, **dict(args.before_option)})
    else:
        before = (load_before(args.before), {})
    variants = {"before": before, "after": (after, dict(args.after_option))}
    if args.profile == "auto":
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
        args.profile = "h100-sxm" if "H100" in name else "h200-engine"
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke else "cuda"
    meta = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)", "torch": torch.__version__,
            "triton": triton.__version__, "python": sys.version.split()[0], "gpu_state_start": _gpu_state(),
            "host_probe": host_probe(1 if args.smoke else 3), "commit": code_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    t0 = time.time()
    for name, mod in variants.items():  # kernels built and loaded once, outside every measured unit
        for pol in args.policies:
            run_unit(mod, scenario(pol, 1024 if not args.smoke else args.lp, args.k, 16 if not args.smoke else 4,
                                   args.profile, args.smoke), 16, False, device)
    meta["warm_up_s"] = time.time() - t0
    print(f"warm-up {meta['warm_up_s']:.0f} s; host probe {meta['host_probe']['us_per_plan']:.0f} us a plan",
          flush=True)
    plan = [(r, pol, v, False) for r in range(args.reps) for pol in args.policies
            for v in (("before", "after") if r % 2 == 0 else ("after", "before"))]
    if args.probe:
        plan += [(args.reps, pol, v, True) for pol in args.probe_policies for v in ("before", "after")]
    units, steps, alone = [], [], []
    for rep, pol, v, probe in plan:
        if time.time() - t0 > args.budget_s:
            print(f"budget reached: stopping before rep {rep} {pol} {v}", flush=True)
            break
        t = time.time()
        sc = scenario(pol, args.lp, args.k, args.requests, args.profile, args.smoke)
        recs, extra = run_unit(variants[v], sc, args.requests, probe, device)
        if "alone" in extra:
            alone += [{"rep": rep, "policy": pol, "variant": v, **a} for a in extra["alone"]]
            extra["alone_summary"] = alone_summary(extra.pop("alone"))
        s = summarize(recs, args.requests)
        units.append({"rep": rep, "policy": pol, "variant": v, "probe": probe, "wall_s": time.time() - t,
                      **s, **extra})
        steps += [{"rep": rep, "policy": pol, "variant": v, "probe": probe, **r} for r in recs]
        d = s.get("decode", {})
        print(f"rep {rep} {pol:8} {v:6}{' probe' if probe else ''}: decode step p50 {d.get('step_ms_p50', 0):.3f} ms, "
              f"overhead p50 {d.get('overhead_ms_p50', 0):.3f} ms ({time.time() - t:.0f} s)", flush=True)
        meta["gpu_state_end"] = _gpu_state()
        (args.out / "engine_host.json").write_text(json.dumps({"meta": meta, "units": units}, indent=1))
        for name, rows in (("steps.csv", steps), ("alone.csv", alone)):  # per step: raw, kept outside git
            with open(args.out / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
                w.writeheader()
                w.writerows(rows)
    table(units)


def _option(text: str) -> tuple[str, object]:
    """NAME=VALUE -> (NAME, VALUE as a Python literal, else the string)."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def alone_summary(alone: list[dict]) -> dict:
    """The replays alone of a probe unit's steps: median, min and max over the steps of each step's median host time
    of `replay()` and of the device's wait for the graph's first node, and how many steps (pure)."""
    ok = [a for a in alone if "error" not in a]
    out = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
           for k in ("host_replay_s", "first_node_wait_s") if (v := [a[k] for a in ok])}
    return {**out, "steps": len(ok), "errors": len(alone) - len(ok)}


def table(units: list[dict]) -> None:
    print("\ndecode-only steps, medians per unit; 'full' = steps with the whole burst decoding")
    print(f"{'rep':>3} {'policy':8} {'variant':7} {'step ms':>8} {'overhead ms':>12} {'full: step':>11} "
          f"{'overhead':>9} {'steps':>6}")
    for u in units:
        d, f = u.get("decode", {}), u.get("decode_full", {})
        print(f"{u['rep']:3d} {u['policy']:8} {u['variant']:7} {d.get('step_ms_p50', 0):8.3f} "
              f"{d.get('overhead_ms_p50', 0):12.3f} {f.get('step_ms_p50', 0):11.3f} {f.get('overhead_ms_p50', 0):9.3f} "
              f"{d.get('steps', 0):6d}{'  probe' if u['probe'] else ''}")


if __name__ == "__main__":
    main()
