"""Section `copy_overlap`: how much of a step's compute hides host-tier KV copies (the profile's ``host.overlap``).

The cost model prices a step with host-tier copies as ``compute + max(0, copy - overlap * compute)``
(granisim/costmodel/transfers.py ``exposed_seconds``). This section runs the two side by side on the GPU and
solves that formula for ``overlap`` at each point:

* compute: one step's dense layers of the model, every layer (gpu_backend.executor.model ``TorchLayers`` over
  ``RandomWeights``: norms, QKV projection, RoPE, O projection, SwiGLU MLP, the final norm and LM head of the
  sampled rows), captured in a CUDA graph and replayed on the default stream, as the engine runs its steps.
  Attention is left out (its output is stood in by the queries). Points: 64 decode rows (every row sampled:
  weight-read bound) and prefills of 512 and 2,048 rows (one row sampled: GEMM bound).
* copy: a HOT slab of N tokens (every layer's K and V rows: one GPU run to one host run) moved by
  ``gpu_backend.executor.transfers.HostKV.move``, the real engine's transfer code (staging gathers on the GPU
  plus the copies across the link), on ``HostKV.stream``; to the host and to the GPU separately. N is sized
  from a probe of the link so that the copy alone takes ``ratio`` x the compute alone (ratios 1.25 and 2: the
  formula's regime ``copy > overlap * compute`` holds for any overlap <= 1); the rows record N and the
  ratio reached.
* each sample starts both streams behind one gate (a sleep kernel on the default stream that the side stream
  waits for, long enough for the host to queue everything; ``gate_late`` counts samples where it was not),
  CUDA events around compute alone, copy alone, and both at once, one synchronize at the end. Median, p10, p90
  over ``reps`` samples, the three kinds interleaved.

Per point: ``overlap = (t_compute + t_copy - t_both) / t_compute`` from the medians (1: the copy runs fully
beside the compute; 0: they serialize), nothing clipped; also the compute's and the copy's slowdown when run
together (their spans from the gate in the joint run over their times alone). :func:`fit` gives the profile
value: the median overlap over the points in the formula's regime (``t_copy >= t_compute``), with min and max.

    python -m calibration.measure.copy_overlap --out RAW/copy_overlap [--model llama-3.1-8b] [--smoke]

Writes OUT/copy_overlap.csv and OUT/copy_overlap.json (meta, fit, rows). On the CPU (``--smoke``, a tiny
shape) the three run one after another and only check that the section runs; the figures mean nothing there.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import triton

from calibration.measure.common import stats, write_csv
from gpu_backend.bench.host_work import code_commit
from gpu_backend.bench.timing import graph_of, write_run
from gpu_backend.executor.model import RandomWeights, TorchLayers, logits, rope_tables
from gpu_backend.executor.transfers import HostKV
from granisim.config.models import ModelShape, get_model
from granisim.kv.host_tier import KVTransfer

KINDS = ("compute", "copy", "both")
FIELDS = ["rows", "sampled", "direction", "ratio_target", "tokens", "bytes", "reps", "gate_us", "gate_late",
          *(f"{k}_{s}_us" for k in KINDS for s in ("median", "p10", "p90")),
          "compute_in_both_median_us", "copy_in_both_median_us", "copy_over_compute", "overlap",
          "compute_slowdown", "copy_slowdown"]
TINY = ModelShape("tiny", 2, 64, 4, 1, 16, 128, 256)
PROBE_GATE_US = 5000.0  # the gate of the samples that size the copies


def overlap(t_compute: float, t_copy: float, t_both: float) -> float:
    """The ``overlap`` that makes ``t_compute + max(0, t_copy - overlap * t_compute)`` equal ``t_both`` (when
    ``t_copy >= overlap * t_compute``); not clipped."""
    return (t_compute + t_copy - t_both) / t_compute


def fit(rows: list[dict]) -> dict:
    """``host.overlap``: the median of :func:`overlap` over the rows whose copy alone took at least as long as
    their compute alone (where the formula's max() is surely past 0); the others are counted in ``excluded``.
    Works on the raw medians (CSV strings too)."""
    used, excluded = [], 0
    for r in rows:
        tc, tx, tb = (float(r[f"{k}_median_us"]) for k in KINDS)
        if tx >= tc:
            used.append(overlap(tc, tx, tb))
        else:
            excluded += 1
    if not used:
        return {"host.overlap": float("nan"), "overlap_min": float("nan"), "overlap_max": float("nan"),
                "points": 0, "excluded": excluded}
    return {"host.overlap": statistics.median(used), "overlap_min": min(used), "overlap_max": max(used),
            "points": len(used), "excluded": excluded}


# ---- the two workloads --------------------------------------------------------------------------------
def compute_step(w: RandomWeights, n_rows: int, n_sampled: int):
    """One step's dense layers over ``n_rows`` rows (a function of no arguments; its inputs are fixed)."""
    g = torch.Generator(device=w.device).manual_seed(1)
    x = torch.randn(n_rows, w.shape.hidden, generator=g, device=w.device).to(w.dtype)
    rot = rope_tables(torch.arange(n_rows, device=w.device), w.inv_freq, w.dtype)
    sample = torch.arange(n_rows - n_sampled, n_rows, device=w.device)

    def step():
        layers = TorchLayers(w, x)
        for layer in w.layers:
            q, _, _ = layers.attn_in(layer, rot)
            layers.attn_out_mlp(layer, q)  # attention left out: the queries stand in for its output
        return logits(w, layers.final(sample))

    return step


class Timer:
    """Samples of compute alone, copy alone, and both (copy on ``host.stream``), started behind one gate."""

    def __init__(self, host: HostKV):
        self.host = host
        self.cuda = host.stream is not None
        self.cycles_per_us = self._cycles_per_us() if self.cuda else 0.0

    @staticmethod
    def _cycles_per_us() -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        e0.record()
        torch.cuda._sleep(10**7)
        e1.record()
        torch.cuda.synchronize()
        return 10**7 / (e0.elapsed_time(e1) * 1e3)

    def sample(self, compute, copy, gate_us: float = 0.0) -> dict:
        """Microseconds from the gate's opening to the end of the compute, of the copy, and of both (``end``);
        ``queue_us``: the host's time to queue it all; ``late``: the gate opened before the host had."""
        t0 = time.perf_counter()
        if not self.cuda:  # CPU: one after the other, wall clock
            if compute:
                compute()
            t1 = time.perf_counter()
            if copy:
                copy()
            t2 = time.perf_counter()
            return {"compute": (t1 - t0) * 1e6, "copy": (t2 - t0) * 1e6, "end": (t2 - t0) * 1e6,
                    "queue_us": 0.0, "late": False}
        cur, side = torch.cuda.current_stream(), self.host.stream
        start, c_end, x_end, end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        torch.cuda._sleep(int(gate_us * self.cycles_per_us))
        start.record(cur)
        if compute:  # one graph launch: queued before the copy's many launches
            compute()
            c_end.record(cur)
        if copy:
            side.wait_event(start)
            with torch.cuda.stream(side):
                copy()
                x_end.record(side)
            cur.wait_event(x_end)
        end.record(cur)
        queue_us = (time.perf_counter() - t0) * 1e6
        late = start.query()
        torch.cuda.synchronize()
        return {"compute": start.elapsed_time(c_end) * 1e3 if compute else 0.0,
                "copy": start.elapsed_time(x_end) * 1e3 if copy else 0.0,
                "end": start.elapsed_time(end) * 1e3, "queue_us": queue_us, "late": late}

    def gate_for(self, compute, copy) -> float:
        """A gate (us): three times the host's time to queue both, plus 1 ms."""
        if not self.cuda:
            return 0.0
        self.sample(compute, copy, 2e4)  # warm
        return 3 * self.sample(compute, copy, 5e4)["queue_us"] + 1000.0

    def point(self, compute, copy, reps: int) -> dict:
        gate = self.gate_for(compute, copy)
        cap = 4 * gate
        got = {k: [] for k in ("compute", "copy", "both", "compute_in_both", "copy_in_both")}
        late = 0
        for _ in range(reps):
            for kind, c, x in (("compute", compute, None), ("copy", None, copy), ("both", compute, copy)):
                s = self.sample(c, x, gate)
                if s["late"]:
                    late += 1
                    gate = min(2 * gate, cap)  # the host needed longer: later samples wait more
                if kind == "both":
                    got["both"].append(s["end"])
                    got["compute_in_both"].append(s["compute"])
                    got["copy_in_both"].append(s["copy"])
                else:
                    got[kind].append(s["end"])
        r = {"reps": reps, "gate_us": gate, "gate_late": late}
        for k in KINDS:
            st = stats(got[k])
            r.update({f"{k}_{q}_us": st[f"{q}_us"] for q in ("median", "p10", "p90")})
        r["compute_in_both_median_us"] = statistics.median(got["compute_in_both"])
        r["copy_in_both_median_us"] = statistics.median(got["copy_in_both"])
        tc, tx, tb = (r[f"{k}_median_us"] for k in KINDS)
        r.update(copy_over_compute=tx / tc, overlap=overlap(tc, tx, tb),
                 compute_slowdown=r["compute_in_both_median_us"] / tc, copy_slowdown=r["copy_in_both_median_us"] / tx)
        return r


# ---- the section ---------------------------------------------------------------------------------------
def measure(shape: ModelShape, points, ratios, *, device: str, dtype, max_tokens: int, reps: int) -> list[dict]:
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    w = RandomWeights(shape, device=dev, dtype=dtype)
    slots = max_tokens
    k = [torch.zeros(slots, shape.n_kv_heads, shape.head_dim, dtype=dtype, device=dev) for _ in range(shape.num_layers)]
    v = [torch.zeros_like(t) for t in k]
    host = HostKV(shape.num_layers, shape.n_kv_heads, shape.head_dim, dtype, dev, slots)
    per_token = 2 * shape.num_layers * shape.n_kv_heads * shape.head_dim * torch.empty(0, dtype=dtype).element_size()
    timer = Timer(host)

    def mover(direction, n):
        ids = np.arange(n)
        t = KVTransfer(direction, ids, ids, n * per_token, True, 1)
        return lambda: host.move(t, k, v)

    rows = []
    for n_rows, n_sampled in points:
        step = compute_step(w, n_rows, n_sampled)
        step()
        if cuda:
            step = graph_of(step)[0]  # the bound replay keeps its graph alive
        t_compute = statistics.median(timer.sample(step, None, PROBE_GATE_US)["end"] for _ in range(3))
        for direction in ("to_host", "to_gpu"):
            probe_n = min(slots, 2 * host.chunk)
            probe = mover(direction, probe_n)
            probe()
            t_probe = statistics.median(timer.sample(None, probe, PROBE_GATE_US)["end"] for _ in range(3))
            for ratio in ratios:
                n = int(min(slots, max(1, math.ceil(ratio * t_compute / t_probe * probe_n))))
                copy = mover(direction, n)
                r = timer.point(step, copy, reps)
                rows.append({"rows": n_rows, "sampled": n_sampled, "direction": direction, "ratio_target": ratio,
                             "tokens": n, "bytes": n * per_token, **r})
                print(f"   rows {n_rows:5d} {direction:7s} x{ratio:<4g} {n:6d} tokens: overlap {r['overlap']:.3f}",
                      flush=True)
    return rows


def meta(argv: list[str], shape: ModelShape, device: str) -> dict:
    """What `write_run` records beside the GPU, torch and Python: the date, code, command, model and versions."""
    m = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": code_commit(),
         "command": "python -m calibration.measure.copy_overlap " + " ".join(argv), "model": shape.name,
         "layers": shape.num_layers, "triton": triton.__version__, "device": device}
    if device == "cuda":
        m["cuda"] = torch.version.cuda
    return m


def table(rows: list[dict]) -> str:
    head = (f"{'rows':>5} {'dir':7} {'tokens':>6} {'compute ms':>10} {'copy ms':>8} {'both ms':>8} {'overlap':>7} "
            f"{'cmp slow':>8} {'copy slow':>9} {'late':>4}")
    out = [head]
    for r in rows:
        out.append(f"{r['rows']:5d} {r['direction']:7} {r['tokens']:6d} {r['compute_median_us'] / 1e3:10.3f} "
                   f"{r['copy_median_us'] / 1e3:8.3f} {r['both_median_us'] / 1e3:8.3f} {r['overlap']:7.3f} "
                   f"{r['compute_slowdown']:8.3f} {r['copy_slowdown']:9.3f} {r['gate_late']:4d}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.measure.copy_overlap", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=49152, help="the longest slab (GPU and pinned host bytes)")
    ap.add_argument("--smoke", action="store_true", help="tiny shape, runs anywhere (CPU included)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    for name, value in (("--reps", args.reps), ("--max-tokens", args.max_tokens)):
        if value < 1:
            ap.exit(2, f"{ap.prog}: {name} must be at least 1, got {value}\n")
    try:
        model = get_model(args.model)
    except ValueError as e:
        ap.exit(2, f"{ap.prog}: --model: {e}\n")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    if args.smoke:
        shape = TINY
        rows = measure(shape, [(4, 4), (16, 1)], (1.25, 2.0), device=device, dtype=torch.float32,
                       max_tokens=32768, reps=2)
    else:
        if device != "cuda":
            ap.error("needs a GPU (or --smoke)")
        shape = model
        rows = measure(shape, [(64, 64), (512, 1), (2048, 1)], (1.25, 2.0), device=device, dtype=torch.bfloat16,
                       max_tokens=args.max_tokens, reps=args.reps)
    out = Path(args.out)
    write_csv(out / "copy_overlap.csv", FIELDS, rows)
    f = fit(rows)
    write_run(out, "copy_overlap", args.smoke, meta={**meta(argv, shape, device), "wall_s": round(time.time() - t0, 1)},
              fit=f, rows=rows)
    print(table(rows))
    print(f"host.overlap = {f['host.overlap']:.4g} (median of {f['points']} points; min {f['overlap_min']:.4g}, "
          f"max {f['overlap_max']:.4g}; {f['excluded']} excluded: copy shorter than compute)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
