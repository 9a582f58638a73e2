"""Section `allreduce`: the all-reduce a tensor-parallel replica runs, for the profiles' ``comm.allreduce.tp{n}.*``.

For each tp the machine's GPUs allow, tp processes (rank r on ``cuda:r``, NCCL, NVLink multicast off:
``NCCL_NVLS_ENABLE=0``) all-reduce one bf16 tensor of each size, 4 KiB to 512 MiB in powers of two: warm-up
calls, then ``reps`` timed repetitions of ``iters`` back-to-back calls between CUDA events on rank 0, after a
barrier; per-call time = elapsed / iters, median and p10 / p90 over the repetitions. Rows: tp, bytes,
median_us, p10_us, p90_us, algbw (bytes / t) and busbw (algbw x 2 (tp - 1) / tp, nccl-tests' bus bandwidth:
NVIDIA/nccl-tests doc/PERFORMANCE.md).

:func:`fit` gives per tp the cost model's curve ``t = latency_s + bytes x 2 (tp - 1) / tp / busbw``
(granisim/costmodel/parallel.py) by least squares of the relative error, first over every other size with
the held-out error on the sizes left out (median and max |error|), then over every size: the coefficients.
``--profile P.json`` writes them into a profile as measured.

    python -m calibration.measure.allreduce --out RAW/allreduce [--tp 2 4 8] [--profile P.json]
    python -m calibration.measure.allreduce --out /tmp/ar --smoke   # gloo on the CPU, tiny sizes: runs anywhere

On the CPU (``--smoke``) it only checks that the section runs; the figures mean nothing there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibration.measure.common import write_csv
from granisim.costmodel.parallel import allreduce_time

FIELDS = ["tp", "bytes", "median_us", "p10_us", "p90_us", "algbw", "busbw"]
SIZES = tuple(1 << k for k in range(12, 30))  # 4 KiB .. 512 MiB


def _bus(tp: int) -> float:
    return 2.0 * (tp - 1) / tp


def _rank(rank: int, tp: int, port: int, sizes, reps: int, cuda: bool, out: str) -> None:
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=tp)
    try:
        dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
        dtype = torch.bfloat16 if cuda else torch.float32
        rows = []
        for nbytes in sizes:
            x = torch.ones(nbytes // torch.empty(0, dtype=dtype).element_size(), dtype=dtype, device=dev)
            iters = 20 if nbytes <= 1 << 22 else 5
            for _ in range(3):
                dist.all_reduce(x)
            times = []
            for _ in range(reps):
                dist.barrier()
                if cuda:
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(iters):
                        dist.all_reduce(x)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e-3 / iters)
                else:
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        dist.all_reduce(x)
                    times.append((time.perf_counter() - t0) / iters)
            t = statistics.median(times)
            q = np.percentile(times, [10, 90])
            rows.append(dict(tp=tp, bytes=nbytes, median_us=t * 1e6, p10_us=q[0] * 1e6, p90_us=q[1] * 1e6,
                             algbw=nbytes / t, busbw=nbytes / t * _bus(tp)))
            del x
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def measure(tp: int, sizes=SIZES, reps: int = 10, cuda: bool = True) -> list[dict]:
    """Rows of one tp (spawns ``tp`` processes)."""
    from gpu_backend.executor.tp import free_port

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast (NVLS) stays off
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        mp.spawn(_rank, args=(tp, free_port(), tuple(sizes), reps, cuda, out), nprocs=tp, join=True)
        return json.loads(Path(out).read_text())


def _solve(rows: list[dict], tp: int) -> tuple[float, float]:
    """(latency_s, busbw) minimising the relative error of ``t = latency_s + bytes x 2 (tp-1)/tp / busbw``."""
    t = np.array([r["median_us"] * 1e-6 for r in rows])
    x = np.array([r["bytes"] * _bus(tp) for r in rows], float)
    a = np.vstack([np.ones_like(x), x]).T / t[:, None]
    (lat, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return max(0.0, float(lat)), 1.0 / max(float(inv_bw), 1e-30)


def fit(rows: list[dict]) -> dict[int, dict]:
    """Per tp: the coefficients (over every size) and the held-out error of a fit over every other size."""
    out = {}
    for tp in sorted({int(r["tp"]) for r in rows}):
        rs = sorted((r for r in rows if int(r["tp"]) == tp), key=lambda r: r["bytes"])
        fit_on, held = rs[::2], rs[1::2]
        lat_h, bw_h = _solve(fit_on, tp)
        err = [abs(allreduce_time(lat_h, bw_h, tp, r["bytes"]) / (r["median_us"] * 1e-6) - 1.0) for r in held]
        lat, bw = _solve(rs, tp)
        out[tp] = {"latency_s": lat, "busbw": bw, "held_out_median": float(np.median(err)) if err else float("nan"),
                   "held_out_max": float(np.max(err)) if err else float("nan"), "sizes": len(rs)}
    return out


def write_profile(path: Path, fitted: dict[int, dict], source: dict) -> None:
    """Put the fitted ``comm.allreduce.tp{n}.*`` into the profile at ``path``, marked measured."""
    from granisim.config.hardware import write_coefficients

    coefs = {}
    for tp, f in fitted.items():
        note = (f"least squares of the relative error over {f['sizes']} sizes (4 KiB-512 MiB, bf16); a fit on "
                f"every other size is off by median {f['held_out_median']:.1%}, max {f['held_out_max']:.1%} on "
                f"the others")
        for key, unit in (("latency_s", "s"), ("busbw", "B/s")):
            coefs[f"comm.allreduce.tp{tp}.{key}"] = {"value": f[key], "unit": unit,
                                                    "source": {**source, "note": note}}
    write_coefficients(path, coefs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.measure.allreduce", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8], help="tp degrees (those the GPUs allow)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--profile", type=Path, help="write the fit into this profile (JSON)")
    ap.add_argument("--smoke", action="store_true", help="gloo on the CPU, tiny sizes (runs anywhere)")
    args = ap.parse_args(argv)

    def fail(msg: str) -> int:
        print(f"python -m calibration.measure.allreduce: {msg}", file=sys.stderr)
        return 2

    bad = [n for n in args.tp if n not in (2, 4, 8)]
    if bad:
        return fail(f"--tp {bad[0]}: give 2, 4 or 8")
    if args.profile is not None and (args.smoke or not args.profile.is_file()):
        return fail(f"--profile {args.profile}: " + ("--smoke figures mean nothing, leave it out" if args.smoke
                                                     else "no such file"))
    gpus = torch.cuda.device_count()
    if args.smoke:
        degrees, sizes, cuda = [2], SIZES[:4], False
    else:
        degrees, sizes, cuda = [n for n in args.tp if n <= gpus], SIZES, True
        if not degrees:
            return fail(f"--tp {' '.join(map(str, args.tp))}: this machine has {gpus} GPU(s) (use --smoke on a CPU)")
    rows = []
    for tp in degrees:
        got = measure(tp, sizes, 3 if args.smoke else args.reps, cuda)
        rows += got
        print(f"tp = {tp}: " + ", ".join(f"{r['bytes'] >> 10} KiB {r['busbw'] / 1e9:.1f} GB/s" for r in got[::4]))
    out = Path(args.out)
    write_csv(out / "allreduce.csv", FIELDS, rows)
    fitted = fit(rows)
    (out / "fit.json").write_text(json.dumps(fitted, indent=2) + "\n")
    for tp, fv in fitted.items():
        print(f"comm.allreduce.tp{tp}.latency_s = {fv['latency_s']:.4g}  busbw = {fv['busbw']:.4g} B/s  "
              f"(held out: median {fv['held_out_median']:.1%}, max {fv['held_out_max']:.1%})")
    if args.profile is not None:
        source = {"kind": "measured", "date": datetime.date.today().isoformat(),
                  "command": "python -m calibration.measure.allreduce --out RAW/allreduce --profile ...",
                  "gpu": torch.cuda.get_device_name(0), "versions": f"torch {torch.__version__}, "
                  f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"}
        write_profile(args.profile, fitted, source)
        print(f"wrote {args.profile}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
