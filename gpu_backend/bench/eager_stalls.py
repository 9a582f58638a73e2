"""Where do the long eager steps' stalls go? Host vs device time per breakdown key, step by step.

    python scripts/eager_stalls_h200.py --out OUT [--workload control_short] [--requests 64]

Runs one validation workload through the real engine (GPU). For every eager step it records each
part's device time (CUDA events, as the executor measures it) and the host time between the same
part boundaries (perf_counter), then lists the steps whose attention parts took over 8 ms on the
device beside their host time, and writes OUT/eager_stalls.json. A host time as long as the device
time says the host was late launching (the device waited); a short one says the device itself was slow.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ATTN = ("attn_decode", "attn_prefix", "merge")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workload", default="control_short")
    ap.add_argument("--requests", type=int, default=64)
    args = ap.parse_args()

    from granisim.validation.gpu_runs import validation_scenario

    from gpu_backend.executor import timing
    from granisim.core.serving_loop import ServingLoop
    from gpu_backend.executor import for_setup as gpu_executor
    from granisim.experiments.run import prepare

    host_marks: dict[int, list] = {}  # id(timer) -> [(key, perf_counter)]
    switch = timing.PartTimer.switch

    def recording_switch(self, key):
        if self.enabled and not self.in_graph:
            host_marks.setdefault(id(self), []).append((key, time.perf_counter()))
        return switch(self, key)

    timing.PartTimer.switch = recording_switch
    setup = prepare(validation_scenario(args.workload, args.requests, "h200"))
    ex = gpu_executor(setup, "cuda", watch_allocs=True)
    rows = []
    execute = ex.execute

    def traced(plan):
        host_marks.clear()
        t = time.perf_counter()
        res = execute(plan)
        wall = time.perf_counter() - t
        if plan.num_tokens > ex.graph_max_rows:
            marks = list(host_marks.values())[-1] if host_marks else []  # a re-run: its own timer, the last
            host: dict[str, float] = {}
            gaps = []
            for (k, a), (_, b) in zip(marks, marks[1:]):
                if k is not None:
                    host[k] = host.get(k, 0.0) + b - a
                    gaps.append((b - a, k))
            gaps.sort(reverse=True)
            rows.append({"step": plan.step, "tokens": plan.num_tokens, "device_s": res.duration_s, "wall_s": wall,
                         "device": dict(res.breakdown), "host": host, "longest_host_gaps": gaps[:3]})
        return res

    ex.execute = traced
    ServingLoop(setup, ex, progress=False).run()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eager_stalls.json").write_text(json.dumps({"executor": ex.stats(), "steps": rows}, indent=2))
    print("step  tokens  device ms  attn device ms  attn host ms  longest host gaps (ms, key)")
    for r in rows:
        dev = sum(r["device"].get(k, 0.0) for k in ATTN)
        if dev > 0.008:
            hst = sum(r["host"].get(k, 0.0) for k in ATTN)
            gaps = ", ".join(f"{g * 1e3:.1f} {k}" for g, k in r["longest_host_gaps"])
            print(f"{r['step']:5d} {r['tokens']:6d} {r['device_s'] * 1e3:9.1f} {dev * 1e3:14.1f} "
                  f"{hst * 1e3:13.1f}  {gaps}")
    print(f"{len(rows)} eager steps")


if __name__ == "__main__":
    main()
