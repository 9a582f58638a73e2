"""The same GEMM and attention kernels timed cold (after idling) and under sustained high-power load.

    python -m gpu_backend.bench.sustained_load --out OUT [--idle-s 20] [--load-s 60] [--probe-every-s 5]

Phases, each kernel timed (median of repeats, L2 flushed: ``timing.bench``) at every probe:

1. ``cold``: after ``--idle-s`` seconds of idling;
2. ``load``: the largest GEMM run back to back for ``--load-s`` seconds (the GPU at its power cap, as in a
   long-prompt replay), the kernels probed every ``--probe-every-s`` seconds between bursts;
3. ``recovered``: after idling ``--idle-s`` seconds again.

A read-only ``nvidia-smi`` log (every 100 ms: power, power limit, SM and memory clocks, temperature,
throttle reasons; nothing is ever set) runs throughout (OUT/gpu_log.csv; skipped with a note without
nvidia-smi), and each phase gets its clock/power summary. Writes OUT/sustained_load.json and
OUT/sustained_load.md: per kernel the cold median, the median of the load probes in the last half of the
load, their ratio, and the clock each phase ran at. The question it answers: does the clock under sustained
load explain why long-prompt steps ran 5-7% slower than the same kernels in other runs?
``--smoke`` runs tiny shapes for seconds (also on a CPU, with TRITON_INTERPRET=1).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime
from pathlib import Path

# kernels: name -> (kind, shape); Llama-3.1-8B's MLP up/gate GEMM and prefill/decode attention
KERNELS = {
    "gemm_T2048": ("gemm", (2048, 4096, 28672)),
    "gemm_T8192": ("gemm", (8192, 4096, 28672)),
    "prefill_attn_4096": ("extend", (1, 4096)),
    "decode_attn_B64_L4096": ("decode", (64, 4096)),
}
SMOKE = {"gemm_T64": ("gemm", (64, 128, 256)), "prefill_attn_64": ("extend", (1, 64)),
         "decode_attn_B2_L64": ("decode", (2, 64))}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m gpu_backend.bench.sustained_load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--idle-s", type=float, default=20.0, help="idle before the cold and the recovered probes")
    ap.add_argument("--load-s", type=float, default=60.0, help="seconds of back-to-back GEMMs")
    ap.add_argument("--probe-every-s", type=float, default=5.0, help="seconds of load between probes")
    ap.add_argument("--no-log", action="store_true", help="no nvidia-smi log")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, seconds in all (CPU too)")
    args = ap.parse_args(argv)
    for name in ("idle_s", "load_s", "probe_every_s"):
        v = getattr(args, name)
        if not v > 0 and not (name == "idle_s" and v == 0):
            ap.error(f"--{name.replace('_', '-')}: value {v:g}: must be > 0")
    if args.probe_every_s > args.load_s:
        ap.error(f"--probe-every-s: value {args.probe_every_s:g}: longer than --load-s {args.load_s:g}")
    if args.smoke:
        args.idle_s, args.load_s, args.probe_every_s = min(args.idle_s, 0.5), min(args.load_s, 2.0), \
            min(args.probe_every_s, 1.0)
    return args


def _kernel(kind: str, shape: tuple):
    """A zero-argument callable running the kernel once on the device (inputs made here)."""
    import torch

    from .problems import D, Pool, dev, i32, queries, seqs

    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    if kind == "gemm":
        t, k, n = shape
        a = torch.randn(t, k, device=dev(), dtype=dtype)
        w = torch.randn(k, n, device=dev(), dtype=dtype)
        return lambda: a @ w
    from ..kernels.decode import decode_attention
    from ..kernels.extend import extend_attention

    b, length = shape
    pool = Pool(max(b * length, 64) + 16)
    n_q = 32
    if kind == "extend":
        q = queries(b * length, n_q, pool.dtype)
        kn = torch.randn(b * length, 8, D, device=dev(), dtype=pool.dtype)
        from ..kernels import layout as L

        prefix = L.Slabs(i32([0] * b), i32([0] * b))  # no cached prefix
        indptr = i32([i * length for i in range(b + 1)])
        return lambda: extend_attention(q=q, k_new=kn, v_new=kn, qo_indptr=indptr, k_cache=pool.k, v_cache=pool.v,
                                        prefix=prefix, max_qo_len=length, check=False)
    kv = seqs(pool, "slots", b, length)
    q = queries(b, n_q, pool.dtype)
    out, lse = torch.empty_like(q), torch.empty(b, n_q, device=q.device)
    return lambda: decode_attention(q=q, k_cache=pool.k, v_cache=pool.v, kv=kv, out=out, lse=lse, check=False,
                                    max_kv_len=length)


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def probe(fns: dict) -> dict:
    from .timing import bench

    return {name: bench(fn, target_ms=20.0, min_reps=5, max_reps=50)["median_us"] for name, fn in fns.items()}


def run(args) -> dict:
    from granisim.validation.gpu_log import GpuLog, log_summary, read_gpu_log

    spec = SMOKE if args.smoke else KERNELS
    fns = {name: _kernel(*spec[name]) for name in spec}
    load = fns[max((n for n in spec if spec[n][0] == "gemm"), key=lambda n: spec[n][1][0])]
    probe(fns)  # first launches (Triton builds) before anything is timed
    phases, probes = {}, []
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "gpu_log.csv"
    with GpuLog(log_path, enabled=not args.no_log) as log:
        def idle_then(phase):
            _sync()
            time.sleep(args.idle_s)
            t0 = datetime.now()
            probes.append({"phase": phase, "t_s": 0.0, "us": probe(fns)})
            phases[phase] = (t0, datetime.now())

        idle_then("cold")
        start, t0 = time.time(), datetime.now()
        while time.time() - start < args.load_s:
            burst = time.time()
            while time.time() - burst < args.probe_every_s:
                for _ in range(8):
                    load()
                _sync()
            probes.append({"phase": "load", "t_s": round(time.time() - start, 2), "us": probe(fns)})
        phases["load"] = (t0, datetime.now())
        idle_then("recovered")
    clocks = {}
    if log_path.exists() and log_path.stat().st_size:
        df = read_gpu_log(log_path)
        clocks = {p: log_summary(df, a, b) for p, (a, b) in phases.items()}
    return {"date": datetime.now().isoformat(timespec="seconds"), "args": {k: str(v) for k, v in vars(args).items()},
            "kernels": {n: {"kind": k, "shape": list(s)} for n, (k, s) in spec.items()}, "probes": probes,
            "clocks": clocks, "log_note": log.note, "table": table_rows(probes)}


def table_rows(probes: list[dict]) -> list[dict]:
    """Per kernel: the cold median, the median of the load probes in the last half of the load, their ratio,
    and the recovered median."""
    def med(rows):
        return statistics.median(rows) if rows else float("nan")

    load = [p for p in probes if p["phase"] == "load"]
    late = [p for p in load if p["t_s"] >= max(q["t_s"] for q in load) / 2] if load else []
    out = []
    for name in probes[0]["us"]:
        cold = med([p["us"][name] for p in probes if p["phase"] == "cold"])
        hot = med([p["us"][name] for p in late])
        out.append({"kernel": name, "cold_us": cold, "load_us": hot, "load_vs_cold": hot / cold - 1,
                    "recovered_us": med([p["us"][name] for p in probes if p["phase"] == "recovered"])})
    return out


def markdown(res: dict) -> str:
    lines = ["| kernel | cold (us) | under load, last half (us) | load vs cold | recovered (us) |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['kernel']} | {r['cold_us']:.1f} | {r['load_us']:.1f} | {r['load_vs_cold']:+.1%} | "
              f"{r['recovered_us']:.1f} |" for r in res["table"]]
    if res["clocks"]:
        lines += ["", "| phase | samples | SM clock p50 / p10 (MHz) | power p50 (W) | limit (W) | at power cap | "
                      "HW/thermal slowdown | max temp (C) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for p, c in res["clocks"].items():
            if c.get("samples"):
                lines.append(f"| {p} | {c['samples']} | {c['sm_mhz_p50']:.0f} / {c['sm_mhz_p10']:.0f} | "
                             f"{c['power_w_p50']:.0f} | {c['power_limit_w']:.0f} | {c['power_capped_share']:.0%} | "
                             f"{c['hw_slowdown_share']:.0%} | {c['temp_c_max']:.0f} |")
    elif res["log_note"]:
        lines += ["", f"No clock log: {res['log_note']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    res = run(args)
    (args.out / "sustained_load.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / "sustained_load.md").write_text(markdown(res))
    print(markdown(res), end="")


if __name__ == "__main__":
    main()
