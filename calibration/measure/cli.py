"""Calibration microbenchmarks: raw timings of one model's operators on this GPU, as CSV.

The command: its sections, their time shares, the run's meta.json (the package docstring says what
is timed and how)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback

import torch
import triton

from gpu_backend.kernels.checks import num_sms
from granisim.config.models import get_model

from . import common
from .attention import s_decode, s_decode_buckets, s_extend, s_extend_order, s_extend_ragged, s_extend_shapes, s_prefix
from .common import CUDA, DEV, Pool, Run
from .linear import s_ceilings, s_linear
from .moe import s_grouped_gemm, s_linear_tp
from .overhead import s_overhead
from .shared_decode import s_shared_decode
from .small_kernels import s_small

# share of --budget-s per section; deadlines are cumulative (a section may use what earlier ones left)
SECTIONS = [("ceilings", s_ceilings, 0.03), ("dense", lambda r: s_prefix(r, "dense"), 0.14),
            ("cascade", lambda r: s_prefix(r, "cascade"), 0.24), ("decode", s_decode, 0.14),
            ("linear", s_linear, 0.14), ("small", s_small, 0.06), ("extend", s_extend, 0.12),
            ("overhead", s_overhead, 0.08), ("extend_shapes", s_extend_shapes, 0.02),
            ("linear_tp", s_linear_tp, 0.05), ("grouped_gemm", s_grouped_gemm, 0.05),
            ("extend_ragged", s_extend_ragged, 0.05), ("extend_order", s_extend_order, 0.05),
            ("shared_decode", s_shared_decode, 0.3), ("decode_buckets", s_decode_buckets, 0.3)]
# run only when named in --only (tensor-parallel shard GEMMs, MoE grouped GEMMs, ragged prefills and their grid
# orders, decode over shared prefixes and at the engine's batch buckets): a default run is unchanged
OPT_IN = {"linear_tp", "grouped_gemm", "extend_ragged", "extend_order", "shared_decode", "decode_buckets"}


def meta(args, model):
    m = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "commit": args.commit, "tree": args.tree,
         "command": "python -m calibration.measure " + " ".join(sys.argv[1:]),
         "gpu_flag": args.gpu, "model": model.name, "torch": torch.__version__, "triton": triton.__version__,
         "python": platform.python_version(), "smoke": bool(args.smoke), "cuda_available": CUDA,
         "timing": ("CUDA graph of k calls on k data copies (copies >= 3 L2s, k <= 32; the calls repeated inside the "
                    "graph when a replay would be shorter than 50 us); per-call time = replay / calls; "
                    "median, p10, p90 over replays; bf16 random normal data")}
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        m.update(gpu=p.name, sms=p.multi_processor_count, gpu_mem_bytes=p.total_memory, cuda=torch.version.cuda,
                 l2_bytes=getattr(p, "L2_cache_size", None), capability=list(torch.cuda.get_device_capability(0)))
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.measure", description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default="h200", help="profile name the fit will write (recorded)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--tree", default=os.environ.get("TREE", ""), help="working-tree state note (recorded)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--budget-s", type=float,
                    help="time budget shared by the sections (default 330 s on a GPU; none with --smoke, whose "
                         "grids are tiny: a smoke run checks every section whatever the machine's load)")
    ap.add_argument("--only", default="", help="comma-separated sections")
    ap.add_argument("--pool-slots", type=int, default=6 * 2**20)
    ap.add_argument("--moe-model", default="qwen3-30b-a3b", help="the MoE model whose experts grouped_gemm times")
    args = ap.parse_args(argv)
    model = get_model(args.model)
    run = Run(args, model)
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        common.L2_BYTES = getattr(p, "L2_cache_size", common.L2_BYTES) or common.L2_BYTES
    m = meta(args, model)
    m["sms_used_by_launchers"] = num_sms(DEV)
    slots = args.pool_slots if not args.smoke else 4096
    run.pool = Pool(slots, model.n_kv_heads, model.head_dim, run.dtype)
    m["pool_slots"] = slots
    m["sections"] = {}
    only = set(filter(None, args.only.split(",")))
    budget = args.budget_s if args.budget_s is not None else (float("inf") if args.smoke else 330.0)
    cum = 0.0
    for name, fn, share in SECTIONS:
        if (only and name not in only and name != "ceilings") or (name in OPT_IN and name not in only):
            continue
        t = time.time()
        cum += share  # a section may use what earlier sections left unused
        run.deadline = run.t0 + cum * budget
        print(f"== {name} (t = {run.elapsed():.0f} s)", flush=True)
        try:
            res = fn(run)
            if name == "ceilings":
                m["ceilings"] = res
        except Exception as e:  # keep the other sections' rows
            traceback.print_exc()
            run.errors.append(f"{name}: {type(e).__name__}: {e}")
        m["sections"][name] = round(time.time() - t, 1)
        m["errors"], m["truncated"], m["wall_s"] = run.errors, run.truncated, round(run.elapsed(), 1)
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump(m, f, indent=1, default=str)
    for f, _ in run.files.values():
        f.close()
    print(f"done in {run.elapsed():.0f} s; truncated: {run.truncated}; errors: {run.errors}", flush=True)
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
