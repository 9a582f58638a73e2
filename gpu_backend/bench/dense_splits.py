"""How many KV splits the dense prefix pass should use: every split count against the shipped rule
(`split_rule.dense_splits`), as CUDA-graph replays.

    python3 -m gpu_backend.bench.dense_splits --out DIR
    python -m gpu_backend.bench.dense_splits --rescore DIR/dense_splits.json   # no GPU: today's rule on a run
    TRITON_INTERPRET=1 python -m gpu_backend.bench.dense_splits --out DIR --smoke     # CPU: tiny sizes

Why: in the dense grid the G = 5 points (Qwen-2.5: 40 query heads over 8 KV heads) ran far slower per FLOP than
G = 4 (H100, L = 4K, B = 512: 164 us against 65 for 1.25x the work), where the rule then picked launches of several
waves (160 programs of 128 rows over 132 SMs, then 4 splits: 5 waves); this run's data led to today's rule, which
charges a split its partials (reports/kernels/README.md). This times one group of B requests over an
L-token slab at G query heads per KV head, split into n = 1..16 chunks of whole 128-token tiles (each n is one
`kv_chunk`; the combine launch included), and the rule's own pick. Each split's output is checked against the
unsplit one. Prints, per point, the rule's pick and time, the best split and time; writes dense_splits.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from granisim.costmodel import split_rule
from ..kernels import layout as L
from ..kernels.checks import num_sms
from ..kernels.dense import DENSE_MAX_SPLITS, _dense_splits, dense_prefix_attention
from ..kernels.grid import cdiv
from .problems import N_KV, Pool, dev, i32, queries
from .timing import bench_replays, write_run

BLOCK_N = 128


def chunks(Lp: int, max_splits: int) -> dict[int, int]:
    """{split count: kv_chunk} for every distinct count of whole-tile chunks over Lp tokens."""
    out = {}
    for s in range(1, max_splits + 1):
        chunk = cdiv(cdiv(Lp, s), BLOCK_N) * BLOCK_N
        out.setdefault(cdiv(Lp, chunk), chunk)
    return out


def point(pool: Pool, G: int, B: int, Lp: int, max_splits: int) -> dict:
    n_q = G * N_KV
    q = queries(B, n_q, pool.dtype)
    out = torch.empty_like(q)
    lse = torch.empty(B, n_q, device=q.device)
    kw = dict(q=q, k_cache=pool.k, v_cache=pool.v, group_indptr=i32([0, B]), prefix=L.Slabs(i32([0]), i32([Lp])),
              out=out, lse=lse, check=False, max_group_size=B, max_kv_len=Lp)
    programs = cdiv(B * G, 128) * N_KV
    rule_n, _ = _dense_splits(programs, Lp, BLOCK_N, q.device, None)
    row = {"G": G, "B": B, "L": Lp, "M_eff": B * G, "programs": programs, "rule_splits": rule_n, "splits": {}}
    ref = None
    for n, chunk in chunks(Lp, max_splits).items():
        fn = lambda chunk=chunk: dense_prefix_attention(**kw, kv_chunk=chunk)
        fn()
        got = out.float().clone()
        ref = got if ref is None else ref
        t = bench_replays(fn)
        row["splits"][n] = {"kv_chunk": chunk, "us": t["median_us"], "p10_us": t["p10_us"], "p90_us": t["p90_us"],
                            "reps": t["reps"], "max_abs_diff_vs_unsplit": (got - ref).abs().max().item()}
    t = bench_replays(lambda: dense_prefix_attention(**kw))
    row["rule"] = {"us": t["median_us"], "p10_us": t["p10_us"], "p90_us": t["p90_us"], "reps": t["reps"]}
    best = min(row["splits"], key=lambda n: row["splits"][n]["us"])
    row["best_splits"], row["best_us"] = best, row["splits"][best]["us"]
    row["rule_over_best"] = row["rule"]["us"] / row["best_us"]
    return row


def rescore(path: Path) -> list[dict]:
    """Each point of a run: the split count today's rule picks (sms from the run) and its time there, beside the
    run's own rule and its best count."""
    run = json.loads(path.read_text())
    sms = run["meta"]["sms"]
    rows = []
    for r in run["rows"]:
        n, _ = split_rule.dense_splits(r["programs"], r["L"], BLOCK_N, sms=sms, max_splits=DENSE_MAX_SPLITS)
        now = r["splits"][str(int(n[0]))]["us"]
        rows.append({**{k: r[k] for k in ("G", "B", "L", "programs", "rule_splits", "best_splits", "best_us")},
                     "run_rule_us": r["rule"]["us"], "now_splits": int(n[0]), "now_us": now,
                     "now_over_best": now / r["best_us"]})
    print(f"{'G':>2} {'B':>4} {'L':>6} {'progs':>5} {'run n':>5} {'run us':>7} {'now n':>5} {'now us':>7} "
          f"{'best n':>6} {'best us':>7} {'now/best':>8}")
    for r in rows:
        print(f"{r['G']:>2} {r['B']:>4} {r['L']:>6} {r['programs']:>5} {r['rule_splits']:>5} {r['run_rule_us']:7.1f} "
              f"{r['now_splits']:>5} {r['now_us']:7.1f} {r['best_splits']:>6} {r['best_us']:7.1f} "
              f"{r['now_over_best']:8.2f}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rescore", type=Path, metavar="JSON", help="a run's dense_splits.json: today's rule on it")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.rescore:
        if not args.rescore.is_file():
            ap.exit(2, f"--rescore: no such file: {args.rescore}\n")
        rescore(args.rescore)
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.smoke:
        grid, max_splits = [(4, 2, 256), (5, 3, 384)], 3
    else:
        grid, max_splits = list(itertools.product((4, 5, 8), (64, 256, 512), (1024, 4096, 16384))), DENSE_MAX_SPLITS
    pool = Pool(max(Lp for *_, Lp in grid) + 64)
    rows = [point(pool, G, B, Lp, max_splits) for G, B, Lp in grid]
    write_run(args.out, "dense_splits", args.smoke, meta={"sms": num_sms(dev())}, rows=rows)
    print(f"{'G':>2} {'B':>4} {'L':>6} {'progs':>5} {'rule n':>6} {'rule us':>8} {'best n':>6} {'best us':>8} "
          f"{'rule/best':>9}")
    for r in rows:
        print(f"{r['G']:>2} {r['B']:>4} {r['L']:>6} {r['programs']:>5} {r['rule_splits']:>6} {r['rule']['us']:8.1f} "
              f"{r['best_splits']:>6} {r['best_us']:8.1f} {r['rule_over_best']:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
