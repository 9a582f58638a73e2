"""Which tiles the extend (prefill) kernel should launch with: every candidate tile, warp and pipeline-depth setting
on prefill chunks over long cached prefixes, as CUDA-graph replays, beside the bf16 GEMM rate of the same run.

    python3 -m gpu_backend.bench.extend_tiles --out DIR [--configs 64x64w4s2,128x64w8s3]
    TRITON_INTERPRET=1 python -m gpu_backend.bench.extend_tiles --out DIR --smoke     # CPU: tiny sizes

Why: with 64-row tiles and 4 warps the extend kernel ran at 34-35% of the GEMM rate on an H200 (pages of 16;
reports/kernels/h200.md), where the dense prefix pass, the same online softmax over the same K/V rows, reaches
52-76% with 128-row tiles and 8 warps; this run's data chose `extend.default_tiles`. Each point is requests x
chunk new tokens over an L-token cached prefix in one storage (the engine's: slot lists for token/granikv, pages
of 16 for paged16) at G query heads per KV head. Every config's output is checked against the first config's.
Prints, per point, each config's time and TFLOP/s and the best; writes extend_tiles.json.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
import triton

from ..kernels.extend import ORDERS, extend_attention
from .problems import D, N_KV, Pool, i32, queries, seqs
from .timing import bench_replays, ceilings, write_run

# block_m x block_n, warps, pipeline stages, start order; the first (every launch before default_tiles) is the
# reference each output is checked against
CONFIGS = ["64x64w4s2", "64x64w4s3", "128x64w4s2", "128x64w8s2", "128x64w8s3", "128x128w8s2", "128x128w8s3",
           "64x128w4s2", "128x64w8s3:blocks_major", "128x64w8s3:heavy_first", "128x128w8s3:blocks_major",
           "128x128w8s3:heavy_first"]
POINTS = [  # (requests, chunk, prefix L, storage, G)
    (4, 512, 4096, "slots", 4), (4, 512, 16384, "slots", 4), (1, 2048, 16384, "slots", 4),
    (16, 128, 16384, "slots", 4), (8, 1024, 4096, "slots", 4), (1, 4096, 0, "slots", 4),
    (4, 512, 4096, "pages16", 4), (4, 512, 16384, "pages16", 4), (1, 2048, 16384, "pages16", 4),
    (1, 2048, 16384, "slots", 5), (4, 512, 16384, "slots", 5),
]
SMOKE_POINTS = [(2, 9, 20, "slots", 4), (1, 6, 17, "pages16", 5)]
SMOKE_CONFIGS = ["16x16w4s2", "32x16w4s1:blocks_major"]


def parse(config: str) -> dict:
    """'128x64w8s3[:order]' -> extend_attention's tile arguments."""
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)(?::(\w+))?", config)
    if not m or (m[5] and m[5] not in ORDERS):
        raise ValueError(f"config {config!r}: want BMxBNwWARPSsSTAGES[:order], order one of {', '.join(ORDERS)}")
    return dict(block_m=int(m[1]), block_n=int(m[2]), num_warps=int(m[3]), num_stages=int(m[4]),
                order=m[5] or "in_order")


def flops(n_req: int, chunk: int, Lp: int, n_q: int) -> int:
    """QK^T and PV over the prefix (whole) and the chunk (its causal half)."""
    return 4 * n_req * chunk * n_q * D * Lp + 2 * n_req * n_q * D * chunk * chunk


def point(pool: Pool, n_req: int, chunk: int, Lp: int, storage: str, G: int, configs: list[str],
          gemm_tflops: float | None) -> dict:
    n_q, T = G * N_KV, n_req * chunk
    kv = seqs(pool, storage, n_req, Lp)
    q = queries(T, n_q, pool.dtype)
    kn, vn = queries(T, N_KV, pool.dtype, 7), queries(T, N_KV, pool.dtype, 8)
    out, lse = torch.empty_like(q), torch.empty(T, n_q, device=q.device)
    kw = dict(q=q, k_new=kn, v_new=vn, qo_indptr=i32([i * chunk for i in range(n_req + 1)]), k_cache=pool.k,
              v_cache=pool.v, prefix=kv, out=out, lse=lse, check=False, max_qo_len=chunk)
    fl = flops(n_req, chunk, Lp, n_q)
    row = {"requests": n_req, "chunk": chunk, "L": Lp, "storage": storage, "G": G, "flops": fl, "configs": {}}
    ref = None
    for c in configs:
        fn = lambda c=c: extend_attention(**kw, **parse(c))
        try:
            fn()
        except triton.runtime.errors.OutOfResources as e:  # a tile that does not fit this GPU's shared memory
            row["configs"][c] = {"error": str(e).splitlines()[0]}
            continue
        got = out.float().clone()
        ref = got if ref is None else ref
        t = bench_replays(fn)
        tf = fl / (t["median_us"] * 1e-6) / 1e12
        row["configs"][c] = {"us": t["median_us"], "p10_us": t["p10_us"], "p90_us": t["p90_us"], "reps": t["reps"],
                             "TFLOPs": tf, "frac_gemm": tf / gemm_tflops if gemm_tflops else None,
                             "max_abs_diff_vs_first": (got - ref).abs().max().item()}
    ran = {c: v["us"] for c, v in row["configs"].items() if "us" in v}
    row["best"] = min(ran, key=ran.get)
    row["first_over_best"] = ran[configs[0]] / ran[row["best"]] if configs[0] in ran else None
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", help="comma-separated BMxBNwWARPSsSTAGES[:order] (default: the candidate list)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    configs = args.configs.split(",") if args.configs else (SMOKE_CONFIGS if args.smoke else CONFIGS)
    for c in configs:
        try:
            parse(c)
        except ValueError as e:
            ap.exit(2, f"--configs: {e}\n")
    points = SMOKE_POINTS if args.smoke else POINTS
    ceil = ceilings(copy_gib=0.25) if torch.cuda.is_available() else None
    gemm = ceil["gemm_TFLOPs"] if ceil else None
    pool = Pool(max(n * max(Lp, 1) for n, _, Lp, *_ in points) + 64)
    rows = []
    for p in points:
        rows.append(point(pool, *p, configs, gemm))
        r = rows[-1]
        print(f"{r['requests']:>2}x{r['chunk']:<5} L={r['L']:<6} {r['storage']:<8} G={r['G']}  "
              + "  ".join(f"{c} {v['us']:.0f}us {v['TFLOPs']:.0f}TF" if "us" in v else f"{c} failed"
                          for c, v in r["configs"].items())
              + f"  best {r['best']}", flush=True)
    write_run(args.out, "extend_tiles", args.smoke, meta={"configs": configs, "ceilings": ceil}, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
