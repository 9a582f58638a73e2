"""Prefill attention alone against the same launches between a layer's GEMMs, as a step runs them.

    python -m gpu_backend.bench.attention_after_gemm --out OUT [--models llama-3.1-8b qwen-2.5-14b]
        [--cases 2048:0 4096:0 8192:0 8192:8192 2048:16384 512:16384] [--rounds 5] [--smoke]

Inside the engine's long-prompt steps the extend attention takes 10-15% longer than the same kernel timed
alone (``granisim validation step-parts``: 8K-token steps), while the steps' GEMMs take what their tables
say. The GPU's power controller is a candidate: a step's GEMMs hold it at its power cap, and the attention
launched right after them runs at the clock the GEMMs left. This benchmark times, per model and case (new
tokens T over a cached context L, one request), every layer's attention launch with CUDA events in two modes,
alternated ``--rounds`` times:

- ``alone``: the model's layers' attention launches back to back, each behind a short low-power spin
  (``torch.cuda._sleep``) that keeps the queue fed without heating the GPU (what a kernel microbenchmark
  sees: the layer's operands stay in L2 from one launch to the next);
- ``flushed``: as ``alone``, but each launch behind a read of a 256 MiB buffer, as the calibration's timing
  does (``timing.flush_l2``): the attention starts with a cold, clean L2 and a cool GPU;
- ``dirtied``: as ``flushed``, but behind a *write* of the 256 MiB buffer: L2 full of dirty lines whose
  write-back the attention pays, as after a GEMM that wrote its output;
- ``in_layer``: each layer as a step runs it: the QKV projection, the attention, the output projection
  and the MLP's GEMMs on T rows (random bf16 weights of the model's shapes), only the attention timed
  (and, separately, the QKV projection);
- ``in_layer_gap``: as ``in_layer``, with a 1 ms low-power spin between the QKV projection and the attention:
  what the GEMMs leave that fades within a millisecond (the power controller's clock) fades here, what they
  leave in memory (L2 contents) stays.

Every mode is compared with ``flushed``, the condition the calibration times kernels in.

Per mode the median over the layers past the first four (the first ones inherit the mode before), and a
read-only ``nvidia-smi`` log (every 100 ms; nothing is ever set) gives the SM clock and power of each mode.
Writes OUT/attention_after_gemm.json and .md: the attention in each mode (us), each over ``flushed`` (median and
range over the rounds), the QKV projection (us), and each mode's clock. ``--smoke``: tiny shapes,
seconds (also on a CPU with TRITON_INTERPRET=1, wall clock).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

SKIP = 4  # layers at the start of a pass that inherit the mode before
MODES = ("flushed", "alone", "dirtied", "in_layer", "in_layer_gap")
GAP_CYCLES = 2_000_000  # ~1 ms of spinning at up to 1980 MHz
DEFAULT_CASES = ("2048:0", "4096:0", "8192:0", "8192:8192", "2048:16384", "512:16384")


def _case(text: str) -> tuple[int, int]:
    try:
        t, ctx = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"case {text!r}: give NEW_TOKENS:CONTEXT, e.g. 8192:0") from None
    if t < 1 or ctx < 0:
        raise argparse.ArgumentTypeError(f"case {text!r}: new tokens must be >= 1 and context >= 0")
    return t, ctx


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from granisim.config.models import MODELS

    ap = argparse.ArgumentParser(prog="python -m gpu_backend.bench.attention_after_gemm",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["llama-3.1-8b", "qwen-2.5-14b"], choices=sorted(MODELS))
    ap.add_argument("--cases", nargs="+", type=_case, default=[_case(c) for c in DEFAULT_CASES],
                    help="NEW_TOKENS:CONTEXT of one request (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-log", action="store_true", help="no nvidia-smi log")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, seconds in all (CPU too)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: value {args.rounds}: must be >= 1")
    return args


class Layer:
    """One layer's operands on T rows: random bf16 weights of the model's shapes, the attention's inputs over a
    cached context (a slab of ``ctx`` slots)."""

    def __init__(self, shape, t: int, ctx: int, smoke: bool):
        import torch

        from ..kernels import layout as L
        from .problems import Pool, dev, i32, queries

        h, nq, nkv, d, inter = shape.hidden, shape.n_q_heads, shape.n_kv_heads, shape.head_dim, shape.intermediate
        if smoke:
            h, nq, nkv, d, inter = 64, 4, 2, 16, 128
        self.pool = Pool(ctx + 16, n_kv=nkv, d=d)
        dt = self.pool.dtype
        g = torch.Generator(device=dev()).manual_seed(2)

        def rnd(*s):
            return torch.randn(*s, generator=g, device=dev(), dtype=dt) * 0.02

        self.x = rnd(t, h)
        self.w_qkv, self.w_o = rnd(h, (nq + 2 * nkv) * d), rnd(nq * d, h)
        self.w_up, self.w_down = rnd(h, 2 * inter), rnd(inter, h)
        self.q = queries(t, nq, dt, d=d)
        self.kn = torch.randn(t, nkv, d, generator=g, device=dev(), dtype=dt)
        self.prefix = L.Slabs(i32([8]), i32([ctx]))
        self.indptr = i32([0, t])
        self.t = t
        self.dirty = torch.empty(1 if smoke else 256 * 2**20 // 4, device=dev(), dtype=torch.int32)

    def attention(self):
        from ..kernels.extend import extend_attention

        return extend_attention(q=self.q, k_new=self.kn, v_new=self.kn, qo_indptr=self.indptr, k_cache=self.pool.k,
                                v_cache=self.pool.v, prefix=self.prefix, max_qo_len=self.t, check=False)

    def qkv(self):
        return self.x @ self.w_qkv

    def rest(self, o):
        import torch.nn.functional as F

        y = o.reshape(self.t, -1) @ self.w_o
        gu = y @ self.w_up
        a = F.silu(gu[:, : gu.shape[1] // 2]) * gu[:, gu.shape[1] // 2:]
        return a @ self.w_down


def _timed_pass(layer: Layer, n_layers: int, mode: str) -> tuple[list[float], list[float]]:
    """(attention us per layer, GEMMs us per layer) of one pass over ``n_layers`` layers in ``mode``."""
    import torch

    from .timing import flush_l2

    if not torch.cuda.is_available():  # CPU smoke: wall clock per launch
        attn, gemm = [], []
        for _ in range(n_layers):
            t0 = time.perf_counter()
            o, _ = layer.attention()
            attn.append((time.perf_counter() - t0) * 1e6)
            if mode.startswith("in_layer"):
                layer.rest(o)
                t1 = time.perf_counter()
                layer.qkv()
                gemm.append((time.perf_counter() - t1) * 1e6)
        return attn, gemm
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(n_layers)]
    for e in ev:
        if mode.startswith("in_layer"):
            e[2].record()
            layer.qkv()
            e[3].record()
            if mode == "in_layer_gap":
                torch.cuda._sleep(GAP_CYCLES)
        elif mode == "flushed":
            flush_l2()
        elif mode == "dirtied":
            layer.dirty.fill_(1)
        else:
            torch.cuda._sleep(20_000)  # ~10 us of spinning at low power: the queue stays ahead of the host
        e[0].record()
        o, _ = layer.attention()
        e[1].record()
        if mode.startswith("in_layer"):
            layer.rest(o)
    torch.cuda.synchronize()
    attn = [e[0].elapsed_time(e[1]) * 1e3 for e in ev]
    gemm = [e[2].elapsed_time(e[3]) * 1e3 for e in ev] if mode.startswith("in_layer") else []
    return attn, gemm


def run(args) -> dict:
    import torch
    import triton

    from granisim.config.models import get_model
    from granisim.validation.gpu_log import GpuLog, log_summary, read_gpu_log

    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "gpu_log.csv"
    cases = [(min(t, 64), min(c, 64)) for t, c in args.cases] if args.smoke else args.cases
    rows, spans = [], []
    with GpuLog(log_path, enabled=not args.no_log and not args.smoke) as log:
        for name in args.models:
            shape = get_model(name)
            n_layers = 6 if args.smoke else shape.num_layers
            for t, ctx in cases:
                layer = Layer(shape, t, ctx, args.smoke)
                for mode in MODES:  # first launches (Triton builds, cuBLAS heuristics) untimed
                    _timed_pass(layer, 2, mode)
                for r in range(args.rounds):
                    for mode in MODES:
                        a = datetime.now()
                        attn, gemm = _timed_pass(layer, n_layers, mode)
                        spans.append((name, t, ctx, mode, a, datetime.now()))
                        keep = attn[SKIP:] if len(attn) > SKIP else attn
                        rows.append({"model": name, "tokens": t, "context": ctx, "mode": mode, "round": r,
                                     "attn_us": statistics.median(keep),
                                     "gemm_us": statistics.median(gemm[SKIP:] or gemm) if gemm else None})
                del layer
    clocks = []
    if log_path.exists() and log_path.stat().st_size:
        df = read_gpu_log(log_path)
        for name, t, ctx, mode, a, b in spans:
            s = log_summary(df, a, b)
            if s.get("samples"):
                clocks.append({"model": name, "tokens": t, "context": ctx, "mode": mode,
                               "sm_mhz_p50": s["sm_mhz_p50"], "power_w_p50": s["power_w_p50"]})
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
            "software": f"torch {torch.__version__}, triton {triton.__version__}",
            "commit": os.environ.get("COMMIT", "unknown"), "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows, "clocks": clocks, "log_note": log.note, "table": table(rows, clocks)}


def table(rows: list[dict], clocks: list[dict]) -> list[dict]:
    """Per model and case: each mode's attention (median over rounds), each mode over ``flushed`` per round
    (median, min, max), the QKV projection, and each mode's median SM clock where logged (pure)."""
    out = []
    keys = sorted({(r["model"], r["tokens"], r["context"]) for r in rows}, key=lambda k: (k[0], k[1], k[2]))
    for m, t, c in keys:
        mine = [r for r in rows if (r["model"], r["tokens"], r["context"]) == (m, t, c)]
        us = {mode: {r["round"]: r["attn_us"] for r in mine if r["mode"] == mode} for mode in MODES}
        row = {"model": m, "tokens": t, "context": c, "rounds": len(us["flushed"]),
               "gemm_us": statistics.median(r["gemm_us"] for r in mine if r["gemm_us"] is not None)}
        for mode in MODES:
            row[f"{mode}_us"] = statistics.median(us[mode].values()) if us[mode] else None
            mhz = [k["sm_mhz_p50"] for k in clocks if (k["model"], k["tokens"], k["context"], k["mode"]) == (m, t, c, mode)]
            row[f"{mode}_mhz"] = statistics.median(mhz) if mhz else None
            ratios = [us[mode][k] / us["flushed"][k] for k in sorted(us[mode]) if us["flushed"].get(k)]
            if mode != "flushed":
                row[f"{mode}_ratio"] = (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None
        out.append(row)
    return out


def markdown(res: dict) -> str:
    others = [m for m in MODES if m != "flushed"]
    lines = ["| model | new tokens | context | after an L2 flush (us) | "
             + " | ".join(f"{m} (us; / flushed, min-max)" for m in others)
             + " | QKV projection (us) | SM clock per mode (MHz) |",
             "| --- | ---: | ---: | ---: | " + " | ".join("---" for _ in others) + " | ---: | --- |"]
    for r in res["table"]:
        cells = [f"{r[f'{m}_us']:.1f} ({r[f'{m}_ratio'][0]:.3f}, {r[f'{m}_ratio'][1]:.3f}-{r[f'{m}_ratio'][2]:.3f})"
                 if r[f"{m}_ratio"] else "-" for m in others]
        mhz = " / ".join(f"{r[f'{m}_mhz']:.0f}" if r[f"{m}_mhz"] else "-" for m in MODES)
        lines.append(f"| {r['model']} | {r['tokens']} | {r['context']} | {r['flushed_us']:.1f} | " + " | ".join(cells)
                     + f" | {r['gemm_us']:.1f} | {mhz} |")
    if res["log_note"]:
        lines += ["", f"No clock log: {res['log_note']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    (args.out / "attention_after_gemm.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "attention_after_gemm.md").write_text(markdown(res))
    print(markdown(res), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
