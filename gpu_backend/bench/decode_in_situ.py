"""Decode attention inside the engine's steps against the same launches alone.

    python -m gpu_backend.bench.decode_in_situ --out OUT [--units multi_agent_16k:token:qwen-2.5-14b ...]
        [--every 5] [--requests N]

Runs each validation unit (workload:policy:model) through the real engine as `granisim validate`
does, and after every ``--every``-th decode-only step re-launches that step's decode attention (the
decode region and, for prefix groups, the suffix decode: the step's ``attn_decode`` part) alone, over
the same metadata and the same KV: every layer back to back in one CUDA graph, with no GEMM or
other kernel between them, replayed 5 times (median). If the launches alone take what the step
measured, the step's decode time is the kernel's on that data (lengths, slots, padded rows) and a
price that misses it misses the data; if they run faster alone, the step's surroundings slow them.
The decode region is also timed over a compacted copy of its slot ids (each distinct slot, or page,
renumbered in order of first use: the same sharing and lengths, every sequence's KV in runs as a fresh
pool lays it out) beside the slot lists' own shape: their ids' span and runs of consecutive ids.

With ``--prefill-every N``, every N-th eager step with prefill work (over ``graph_max_rows`` tokens: the
long-prompt steps whose price runs low when several requests prefill together) is re-run the same way, part by
part: its extend attention over all layers (``attn_prefill``) and its linear operators on the step's tokens
(``linear``: QKV, RoPE, output projection, MLP and their norms), eagerly as the engine runs them, 3 times,
right after the step (the GPU as hot as the step left it) and, for the first ``--cold`` of them, again after
``--cold-s`` seconds of idling (the GPU's clock back up): if the step and the hot re-run agree but the cool
re-run is faster, the power state is what the price misses (``OUT/in_situ_prefill.csv``).

Writes ``OUT/UNIT/`` (the unit's validation output: steps.parquet with the measured and priced
parts, step by step), ``OUT/validation_UNIT.json`` (so that `granisim validation judge` and `step-parts` read
OUT as a run folder) and ``OUT/in_situ.csv``: unit, step, decode rows (padded), the in-step
``attn_decode`` part and the launches alone, in seconds.
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import time
from pathlib import Path

import torch

from gpu_backend.executor import for_setup
from gpu_backend.executor import metadata, rows
from gpu_backend.executor.launches import StepLaunches
from gpu_backend.executor.model import attn_out_and_mlp, qkv_proj, rope_tables
from gpu_backend.kernels import layout as L
from gpu_backend.kernels.decode import decode_launch

FIELDS = ["unit", "step", "batch", "dec_rows", "grouped_rows", "in_step_s", "alone_s", "alone_p10_s", "alone_p90_s",
          "dec_alone_s", "dec_compact_s", "dec_ids", "dec_distinct_ids", "dec_id_span", "dec_runs"]

PREFILL_FIELDS = ["unit", "step", "tokens", "prefill_requests", "in_step_attn_prefill_s", "in_step_linear_s",
                  "hot_attn_prefill_s", "hot_linear_s", "cold_attn_prefill_s", "cold_linear_s"]


def _eager_time(fn, reps: int = 3) -> float:
    """Median seconds of ``reps`` eager calls of ``fn`` (CUDA events around each; wall clock on a CPU)."""
    times = []
    if not torch.cuda.is_available():
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return sorted(times)[len(times) // 2]
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def _graph_time(fn) -> list[float]:
    """Seconds of 5 replays of ``fn`` captured in one CUDA graph, sorted (after one eager warm-up call)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)


def compacted(kv):
    """``kv`` (slot lists or a page table) with its ids renumbered 0.. in order of first use, and
    (ids, distinct ids, id span, runs of consecutive ids) of the original."""
    ids = kv.indices.long()
    uniq, first = torch.unique(ids, return_inverse=True)
    order = torch.full((uniq.numel(),), ids.numel(), dtype=torch.long, device=ids.device)
    order.scatter_reduce_(0, first, torch.arange(ids.numel(), device=ids.device), reduce="amin")
    rank = torch.empty_like(order)
    rank[torch.argsort(order)] = torch.arange(order.numel(), device=ids.device)
    new = rank[first].to(torch.int32)
    runs = int((ids[1:] != ids[:-1] + 1).sum().item()) + 1 if ids.numel() else 0
    stats = (ids.numel(), uniq.numel(), int(ids.max() - ids.min() + 1) if ids.numel() else 0, runs)
    if isinstance(kv, L.PageTable):
        return L.PageTable(kv.indptr, new, kv.lens, kv.page_size), stats
    return L.SlotLists(kv.indptr, new), stats


class DecodeProbe:
    """The executor protocol around a GpuExecutor; times the decode launches of sampled steps alone."""

    def __init__(self, real, every: int, unit: str, prefill_every: int = 0, cold: int = 0, cold_s: float = 0.0):
        self.real, self.every, self.unit = real, every, unit
        self.prefill_every, self.cold, self.cold_s = prefill_every, cold, cold_s
        self.rows: list[dict] = []
        self.prefill_rows: list[dict] = []
        self._decode_steps = self._prefill_steps = 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def execute(self, plan):
        result = self.real.execute(plan)
        decode_only = all(not r.is_prefill and r.num_new == 1 for r in plan.requests)
        if decode_only and plan.num_tokens <= self.real.graph_max_rows:
            self._decode_steps += 1
            if self._decode_steps % self.every == 0:
                self.rows.append(self._alone(plan, result.breakdown.get("attn_decode", 0.0)))
        elif self.prefill_every and plan.num_tokens > self.real.graph_max_rows:
            self._prefill_steps += 1
            if self._prefill_steps % self.prefill_every == 0:
                self.prefill_rows.append(self._prefill_alone(plan, result.breakdown))
        return result

    def _prefill_alone(self, plan, parts) -> dict:
        ex = self.real
        host = rows.build(plan, ex.num_slots, pad=False)  # an eager step: exact shapes
        meta = metadata.upload(host, ex.arena)
        run = StepLaunches(meta, ex.shape, ex.w.dtype, ex.device)
        s, sh, w = host.shape, ex.shape, ex.w
        T, e = meta.tokens.numel(), s.ext_rows
        q = torch.randn((e, sh.n_q_heads, sh.head_dim), dtype=w.dtype, device=ex.device)
        k = torch.randn((e, sh.n_kv_heads, sh.head_dim), dtype=w.dtype, device=ex.device)
        v = torch.randn_like(k)
        x = torch.randn((T, sh.hidden), dtype=w.dtype, device=ex.device)
        attn = torch.randn((T, sh.n_q_heads, sh.head_dim), dtype=w.dtype, device=ex.device)
        rot = rope_tables(meta.positions, w.inv_freq, w.dtype)

        def extend():
            for kc, vc in zip(ex.k_cache, ex.v_cache):
                run.extend(q, k, v, kc, vc, run.out[:e], run.ext_lse)

        def linear():
            for layer in w.layers:
                qkv_proj(w, layer, x, rot)
                attn_out_and_mlp(layer, x, attn)

        row = dict(unit=self.unit, step=plan.step, tokens=T,
                   prefill_requests=sum(1 for r in plan.requests if r.is_prefill),
                   in_step_attn_prefill_s=parts.get("attn_prefill", 0.0), in_step_linear_s=parts.get("linear", 0.0),
                   hot_attn_prefill_s=_eager_time(extend) if run.extend else 0.0, hot_linear_s=_eager_time(linear))
        if len(self.prefill_rows) < self.cold:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            time.sleep(self.cold_s)
            row.update(cold_attn_prefill_s=_eager_time(extend) if run.extend else 0.0, cold_linear_s=_eager_time(linear))
        return row

    def _alone(self, plan, in_step: float) -> dict:
        ex = self.real
        host = rows.build(plan, ex.num_slots, pad=True)
        meta = metadata.upload(host, ex.arena)  # the arena fits: the step itself just ran from it
        run = StepLaunches(meta, ex.shape, ex.w.dtype, ex.device)
        s = host.shape
        n_q, d = ex.shape.n_q_heads, ex.shape.head_dim
        q = torch.randn((s.dec_rows + s.grouped_rows, n_q, d), dtype=ex.w.dtype, device=ex.device)

        def launches():
            for kc, vc in zip(ex.k_cache, ex.v_cache):
                if run.decode:
                    run.decode(q[:s.dec_rows], kc, vc, run.out[:s.dec_rows], run.dec_lse)
                if run.passes:
                    run.suffix(q[s.dec_rows:], kc, vc, run.suf_o, run.suf_lse)

        times = _graph_time(launches)
        row = dict(unit=self.unit, step=plan.step, batch=len(plan.requests), dec_rows=s.dec_rows,
                   grouped_rows=s.grouped_rows, in_step_s=in_step, alone_s=times[2], alone_p10_s=times[0],
                   alone_p90_s=times[-1])
        if run.decode:
            kv, stats = compacted(meta.decode_kv)
            packed = decode_launch(rows=s.dec_rows, n_q=n_q, n_kv=ex.shape.n_kv_heads, d=d, kv=kv,
                                   max_kv_len=s.dec_max_kv, mean_kv_len=s.dec_mean_kv, device=ex.device)
            qd, od = q[:s.dec_rows], run.out[:s.dec_rows]
            for key, launch in (("dec_alone_s", run.decode), ("dec_compact_s", packed)):
                row[key] = _graph_time(lambda launch=launch: [launch(qd, kc, vc, od, run.dec_lse) for kc, vc in
                                                              zip(ex.k_cache, ex.v_cache)])[2]
            row.update(zip(("dec_ids", "dec_distinct_ids", "dec_id_span", "dec_runs"), stats))
        return row


def parse_unit(text: str, ap: argparse.ArgumentParser) -> tuple[str, str, str]:
    """'workload:policy:model' of the validation set, or one line and exit 2 (``ap.error``)."""
    from granisim.config.models import get_model
    from granisim.validation.gpu_runs import VALIDATION, validation_scenario

    parts = text.split(":")
    if len(parts) != 3:
        ap.error(f"--units: value {text!r}: expected workload:policy:model")
    workload, policy, model = parts
    if workload not in VALIDATION:
        ap.error(f"--units: value {text!r}: unknown workload {workload!r} (one of {', '.join(VALIDATION)})")
    try:
        get_model(model)
        validation_scenario(workload, None, "h200-engine", policy, model)
    except (KeyError, ValueError) as e:  # ScenarioError is a ValueError
        ap.error(f"--units: value {text!r}: {e}")
    return workload, policy, model


def main(argv=None) -> int:
    from granisim.experiments.run import prepare
    from granisim.validation.gpu_runs import unit_name, validation_scenario
    from granisim.validation.validate import validate

    ap = argparse.ArgumentParser(prog="python -m gpu_backend.bench.decode_in_situ", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--units", nargs="+", default=["multi_agent_16k:token:qwen-2.5-14b"],
                    help="workload:policy:model (the validation set's names)")
    ap.add_argument("--every", type=int, default=5, help="probe every N-th decode step")
    ap.add_argument("--requests", type=int, help="requests per unit (default: the validation set's)")
    ap.add_argument("--profile", default="h200-engine")
    ap.add_argument("--prefill-every", type=int, default=0, help="probe every N-th eager prefill step (0: none)")
    ap.add_argument("--cold", type=int, default=0, help="re-run the first N probed prefill steps after idling too")
    ap.add_argument("--cold-s", type=float, default=15.0, help="seconds of idling before a cool re-run")
    args = ap.parse_args(argv)
    units = [parse_unit(u, ap) for u in args.units]
    for name in ("every", "prefill_every", "cold", "cold_s"):
        v = getattr(args, name)
        if v < (1 if name == "every" else 0):
            ap.error(f"--{name.replace('_', '-')}: value {v}: must be at least {1 if name == 'every' else 0}")
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "in_situ.csv", "w", newline="") as f, \
            open(args.out / "in_situ_prefill.csv", "w", newline="") as fp:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        wp = csv.DictWriter(fp, fieldnames=PREFILL_FIELDS)
        wp.writeheader()
        for workload, policy, model in units:
            unit = unit_name(workload, policy, model)
            setup = prepare(validation_scenario(workload, args.requests, args.profile, policy, model))
            probe = DecodeProbe(for_setup(setup, "cuda"), args.every, unit, args.prefill_every, args.cold, args.cold_s)
            rep = validate(setup, probe, args.out / unit, progress=False)
            (args.out / f"validation_{unit}.json").write_text(json.dumps(rep, indent=2, default=str))
            w.writerows(probe.rows)
            wp.writerows(probe.prefill_rows)
            f.flush()
            fp.flush()
            r = probe.rows
            ratio = sorted(x["in_step_s"] / x["alone_s"] for x in r if x["alone_s"] > 0)
            print(f"{unit}: {len(r)} steps probed; in-step / alone median "
                  f"{ratio[len(ratio) // 2] if ratio else float('nan'):.3f}", flush=True)
            del probe
            gc.collect()  # the serving loop's processes hold the executor in reference cycles
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
