"""H200 benchmark of the attention kernels: ceilings, grids, peers, the contiguity question and
one Llama-3.1-8B layer's decode step. One process, one device call; writes h200.json / h200.md.
The sections live in attention_grids.py and step_studies.py; this module runs them in turn.

    PYTHONUNBUFFERED=1 python3 -m gpu_backend.bench.kernels_h200 --out $OUT [--commit HASH]
    python -m gpu_backend.bench.kernels_h200 --smoke --out /tmp/x     # tiny, CPU interpreter
"""
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

from .attention_grids import s_cascade, s_decode, s_dense, s_extend
from .problems import Pool
from .report import write_markdown
from .step_studies import s_contiguity, s_e2e, s_flex, s_merge_write
from .timing import ceilings


class Run:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.res = {"meta": meta(args), "sections": {}, "errors": []}

    def left(self) -> float:
        """Seconds left of the running section's share of the budget."""
        return self.deadline - time.time()

    def save(self):
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, "h200.json"), "w") as f:
            json.dump(self.res, f, indent=1)
        write_markdown(self.res, os.path.join(self.args.out, "h200.md"))

    def section(self, name, fn):
        print(f"== {name} (t = {time.time() - self.t0:.0f} s)", flush=True)
        self.deadline = time.time() + SHARE[name] * self.args.budget_s
        t = time.time()
        try:
            self.res["sections"][name] = fn(self)
        except Exception as e:  # keep the other sections' figures
            traceback.print_exc()
            self.res["errors"].append(f"{name}: {type(e).__name__}: {e}")
        if isinstance(self.res["sections"].get(name), dict):
            self.res["sections"][name]["seconds"] = round(time.time() - t, 1)
        self.save()


def meta(args):
    m = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "commit": args.commit, "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
         "torch": torch.__version__, "python": platform.python_version(), "smoke": args.smoke}
    try:
        import triton
        m["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        m.update(gpu=p.name, sms=p.multi_processor_count, gpu_mem_GiB=round(p.total_memory / 2**30, 1),
                 cuda=torch.version.cuda)
    return m


def s_ceilings(run):
    if not torch.cuda.is_available():
        return {"copy_GBps": 100.0, "gemm_TFLOPs": 1.0, "note": "smoke: not measured"}
    c = ceilings()
    print(f"copy {c['copy_GBps']:.0f} GB/s, bf16 GEMM {c['gemm_TFLOPs']:.0f} TFLOP/s")
    return c


# share of --budget-s each section may take before its grid stops (recorded as truncated)
SHARE = {"ceilings": 0.03, "decode": 0.12, "cascade": 0.25, "dense": 0.1, "merge_write": 0.03,
         "contiguity": 0.07, "e2e": 0.1, "extend": 0.03, "flex": 0.17}
SECTIONS = [("ceilings", s_ceilings), ("decode", s_decode), ("cascade", s_cascade), ("dense", s_dense),
            ("merge_write", s_merge_write), ("contiguity", s_contiguity), ("e2e", s_e2e),
            ("extend", s_extend), ("flex", s_flex)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU interpreter)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="whole run's time budget (s), shared per SHARE")
    ap.add_argument("--only", default="", help="comma-separated section names")
    ap.add_argument("--pool-slots", type=int, default=12 * 2**20)
    args = ap.parse_args(argv)
    run = Run(args)
    run.pool = Pool(args.pool_slots if not args.smoke else 4096)
    only = set(filter(None, args.only.split(",")))
    for name, fn in SECTIONS:
        if not only or name in only or name == "ceilings":
            run.section(name, fn)
    print(f"done in {time.time() - run.t0:.0f} s; errors: {run.res['errors']}")


if __name__ == "__main__":
    main()
