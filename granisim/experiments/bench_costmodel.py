"""Microseconds per `step_cost` call (the simulator calls it tens of thousands of times).

    python -m granisim.experiments.bench_costmodel [--profile a100-80gb] [--model llama-3.1-8b]
        [--out out/bench/costmodel_speed.json]

Plans (warm memo tables unless marked cold): 64 decode requests in 4 prefix groups (cascade / dense / paged mixes), a mixed
prefill + decode step, and a 64-request decode fast-forward of 100 steps.
"""
from __future__ import annotations

import argparse
import json
import timeit
from pathlib import Path


from granisim.costmodel import cost_tables, step_cost
from granisim.config.hardware import get_profile
from granisim.config.models import get_model
from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup

DEFAULT_OUT = "out/bench/costmodel_speed.json"  # outside the tracked tree


def decode_plan(n_req=64, n_groups=4, prefix=16384, paths=("cascade", "dense", "cascade", "paged"), steps=1, G=4):
    reqs, members = [], [[] for _ in range(n_groups)]
    for i in range(n_req):
        g = i % n_groups
        members[g].append(i)
        reqs.append(PlannedRequest(rid=i, context_len=prefix + 100 + 7 * i, num_new=1, is_prefill=False,
                                   group=g, shared_len=prefix))
    groups = tuple(PrefixGroup(key=g, prefix_len=prefix, storage="slab", path=paths[g % len(paths)],
                               members=tuple(m), m_eff=len(m) * G) for g, m in enumerate(members))
    return BatchPlan(step=0, policy="granikv", page_size=1, requests=tuple(reqs), groups=groups, num_steps=steps)


def mixed_plan(G=4):
    base = decode_plan(n_req=60)
    pre = tuple(PlannedRequest(rid=100 + j, context_len=16384 * (j % 2), num_new=512, is_prefill=True) for j in range(4))
    return BatchPlan(step=0, policy="granikv", page_size=1, requests=base.requests + pre, groups=base.groups)


def bench(label, plan, profile, model, number=20000, cold=False):
    """``cold``: empty the memo tables before every call (every group size, token count and
    batch size new), the worst case; warm: repeated shapes, as in a steady simulation."""
    step_cost(plan, profile, model)  # build the cached tables
    tables = cost_tables(profile, model)

    def call():
        if cold:
            tables._memo_prefix.clear()
            tables._memo_lin.clear()
            tables._memo_head.clear()
        step_cost(plan, profile, model)

    t = min(timeit.repeat(call, number=number, repeat=5)) / number
    print(f"{label:<58s} {t * 1e6:8.2f} us/call")
    return t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="a100-80gb")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON of the timings (default {DEFAULT_OUT}; '' to skip)")
    a = ap.parse_args(argv)
    profile, model = get_profile(a.profile), get_model(a.model)
    print(f"step_cost on {profile.name} / {model.name}")
    cases = [("64 decode requests, 4 groups (cascade, dense, cascade, paged)", decode_plan(), {}),
             ("  same, memo tables emptied before every call (cold)", decode_plan(), {"number": 3000, "cold": True}),
             ("64 decode requests, 4 cascade groups", decode_plan(paths=("cascade",)), {}),
             ("60 decode requests + 4 prefill chunks of 512", mixed_plan(), {}),
             ("64 decode requests, 4 groups, num_steps=100 (fast-forward)", decode_plan(steps=100), {"number": 5000})]
    us = {label.strip(): bench(label, plan, profile, model, **kw) * 1e6 for label, plan, kw in cases}
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"profile": profile.name, "model": model.name, "us_per_call": us},
                                          indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
