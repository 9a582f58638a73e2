"""FlashInfer beside our kernels on the kernel report's problems (Llama-3.1-8B: 32 query heads, 8 KV heads,
head dim 128, bf16), on one pool of KV slots that both read through the same page tables.

    PYTHONUNBUFFERED=1 python3 -m gpu_backend.bench.flashinfer_peer --out DIR [--commit HASH]
    TRITON_INTERPRET=1 python -m gpu_backend.bench.flashinfer_peer --smoke --out /tmp/x   # CPU; FlashInfer skipped

decode: B requests, each reading its own context of L tokens through a page table (page size 1: random slots;
page size 16: random pages). Ours: `decode_attention`; FlashInfer: `BatchDecodeWithPagedKVCacheWrapper`, with
CUDA cores (its default) and with tensor cores (`use_tensor_cores=True`). Floor: KV bytes / copy bandwidth.

cascade: B requests over one shared prefix of L tokens plus a private suffix of 257 tokens each (256 + the new
token, as the layer-step study of the kernel report), every page 16 tokens. The prefix is a HOT slab (read by
FlashInfer as its consecutive pages) or random pages. Ours, as the engine runs a decode step: prefix pass (the
dense pass where the engine dispatches it, slab and M_eff = B * 4 >= M_sat; the cascade pass otherwise; both are
timed), suffix decode, LSE merge. FlashInfer: two levels (shared prefix, then the suffixes), through
`MultiLevelCascadeAttentionWrapper` as it comes (FA3 on Hopper) and through FA2 batch-prefill wrappers merged the
same way (`fi_cascade`); the faster is the table's. KV write left out of both. Floor: the larger of bytes read
(prefix once + suffixes) over the copy bandwidth and FLOPs over the bf16 GEMM rate, both measured in the same run
(`timing.ceilings`).

Every output is checked against the other side's (max abs difference) before timing; times are CUDA-graph
replays (plain launches where a capture fails), median of >= 50 with p10/p90, L2 flushed between (timing.bench).

FlashInfer is imported lazily. Its kernels are compiled (JIT, the machine's nvcc) by a child process on tiny
problems, with its own time limit (--fi-compile-s), while our kernels are timed; if it cannot be imported or
compiled the JSON says why, and FlexAttention (`peers.flex_paged`, page 128, its block size) is timed on the
decode problems instead. Writes DIR/flashinfer_peer.json (every point) and DIR/flashinfer_peer_summary.json
(the table's rows, `summarize`).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import traceback

import torch

from ..kernels import layout as L
from ..kernels import reference
from ..kernels.cascade import cascade_prefix_attention
from ..kernels.decode import decode_attention
from ..kernels.dense import dense_prefix_attention
from ..kernels.merge import merge_states
from .kernels_h200 import meta
from .problems import KV_BYTES_PER_TOKEN, N_KV, D, Pool, dev, i32, queries, seqs
from .timing import bench, ceilings, graph_of

N_Q = 32                      # Llama-3.1-8B: G = 4
PAGE = {"slots": 1, "pages16": 16}
MIN_REPS, MAX_REPS = 50, 200
FI_WS_BYTES = 128 * 2**20     # FlashInfer's float workspace (its recommended size)


def grids(smoke: bool) -> dict:
    if smoke:
        return {"dec_kinds": ["slots", "pages16"], "dec_L": [40], "dec_B": [2], "cas_kinds": ["slab", "pages16"],
                "cas_L": [64], "cas_B": [2], "suffix": 5, "pool": 4096}
    return {"dec_kinds": ["slots", "pages16"], "dec_L": [4096, 16384, 32768], "dec_B": [1, 16, 64, 256],
            "cas_kinds": ["slab", "pages16"], "cas_L": [4096, 16384, 32768], "cas_B": [16, 64, 128, 256],
            "suffix": 257, "pool": 8 * 2**20}


def m_sat_rows() -> float:
    """The engine's dense/cascade threshold on M_eff (the H200 profile's M_sat; 128 if it cannot be read)."""
    try:
        from granisim.config.hardware import get_profile
        return float(get_profile("h200")["m_sat"])
    except Exception:  # noqa: BLE001 - the benchmark runs without the simulator's dependencies too
        return 128.0


def _stats(t: dict, mode: str) -> dict:
    return {"us": t["median_us"], "p10_us": t["p10_us"], "p90_us": t["p90_us"], "reps": t["reps"], "mode": mode}



def timed(fn) -> dict:
    """fn's device time: CUDA-graph replays where the capture works (plain launches otherwise, with the reason)."""
    if torch.cuda.is_available():
        try:
            replay, _g = graph_of(fn)
            return _stats(bench(replay, min_reps=MIN_REPS, max_reps=MAX_REPS, target_ms=40.0), "graph")
        except Exception as e:  # noqa: BLE001
            torch.cuda.synchronize()
            r = _stats(bench(fn, min_reps=MIN_REPS, max_reps=MAX_REPS, target_ms=40.0), "plain")
            r["graph_error"] = f"{type(e).__name__}: {e}"[:300]
            return r
    return _stats(bench(fn), "plain")


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()

def _time_variants(r: dict, variants: dict, ours_fn, ours) -> dict:
    """Each FlashInfer variant (name -> builder of its call) checked against ``ours`` and timed into ``r`` (or its
    error recorded), then ours timed again beside them; returns {variant: median us} and marks the fastest."""
    for v, build in variants.items():
        try:
            f = build()
            r[f"fi_{v}_max_abs_diff_vs_ours"] = diff(f(), ours)
            r[f"fi_{v}"] = timed(f)
        except Exception as e:  # noqa: BLE001
            r[f"fi_{v}_error"] = f"{type(e).__name__}: {e}"[:500]
    r["ours_again"] = timed(ours_fn)
    fis = {v: r[f"fi_{v}"]["us"] for v in variants if f"fi_{v}" in r}
    if fis:
        r["fi_best"] = min(fis, key=fis.get)
    return fis



# ---------------------------------------------------------------------------------------------------------------
# problems: our layouts and the same pages in FlashInfer's terms (indptr, indices, last_page_len, page size)

class DecodeProblem:
    def __init__(self, pool: Pool, kind: str, Lc: int, B: int):
        self.kind, self.L, self.B, self.page = kind, Lc, B, PAGE[kind]
        self.kv = seqs(pool, kind, B, Lc)
        self.q = queries(B, N_Q, pool.dtype)
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(B, N_Q, device=self.q.device)
        per = -(-Lc // self.page)
        self.fi = {"indptr": self.kv.indptr, "indices": self.kv.indices,
                   "last": i32([Lc - (per - 1) * self.page] * B), "page": self.page}
        self.bytes = B * Lc * KV_BYTES_PER_TOKEN + 2 * self.q.numel() * self.q.element_size()
        self.flops = 4 * B * N_Q * Lc * D

    def ours(self, pool):
        return lambda: decode_attention(q=self.q, k_cache=pool.k, v_cache=pool.v, kv=self.kv, out=self.out,
                                        lse=self.lse, check=False, max_kv_len=self.L)

    def key(self) -> dict:
        return {"page": self.page, "L": self.L, "B": self.B}


class CascadeProblem:
    """One shared prefix (slab or random pages of 16) + B suffixes of `suffix` tokens (random pages of 16)."""

    def __init__(self, pool: Pool, kind: str, Lc: int, B: int, suffix: int, m_sat: float):
        assert Lc % 16 == 0
        self.kind, self.L, self.B, self.suffix, self.page = kind, Lc, B, suffix, 16
        n_pages = pool.num_slots // 16
        if kind == "slab":  # a page-aligned slab, so FlashInfer reads the same slots as its consecutive pages
            p0 = int(torch.randint(0, n_pages - Lc // 16 + 1, (1,), generator=torch.Generator().manual_seed(Lc + B)))
            self.prefix = L.Slabs(i32([p0 * 16]), i32([Lc]))
            pre_pages = torch.arange(p0, p0 + Lc // 16, device=dev(), dtype=torch.int32)
        else:
            self.prefix = seqs(pool, "pages16", 1, Lc)
            pre_pages = self.prefix.indices
        self.suf = seqs(pool, "pages16", B, suffix, offset=Lc)
        self.q = queries(B, N_Q, pool.dtype)
        self.gp = i32([0, B])
        self.path = "dense" if kind == "slab" and B * (N_Q // N_KV) >= m_sat else "cascade"
        per = -(-suffix // 16)
        self.fi = {"qo": [i32([0, B]), i32(torch.arange(B + 1))],
                   "indptr": [i32([0, Lc // 16]), self.suf.indptr], "indices": [pre_pages, self.suf.indices],
                   "last": [i32([16]), i32([suffix - (per - 1) * 16] * B)], "page": 16}
        z = lambda: torch.empty_like(self.q)  # noqa: E731
        zl = lambda: torch.empty(B, N_Q, device=self.q.device)  # noqa: E731
        self.po, self.so, self.o = z(), z(), z()
        self.pl, self.sl, self.ol = zl(), zl(), zl()
        self.bytes = (Lc + B * suffix) * KV_BYTES_PER_TOKEN + 2 * self.q.numel() * self.q.element_size()
        self.flops = 4 * B * N_Q * (Lc + suffix) * D

    def ours(self, pool, path: str):
        prefix_pass = dense_prefix_attention if path == "dense" else cascade_prefix_attention

        def step():
            prefix_pass(q=self.q, k_cache=pool.k, v_cache=pool.v, group_indptr=self.gp, prefix=self.prefix,
                        out=self.po, lse=self.pl, check=False, max_group_size=self.B, max_kv_len=self.L)
            decode_attention(q=self.q, k_cache=pool.k, v_cache=pool.v, kv=self.suf, out=self.so, lse=self.sl,
                             check=False, max_kv_len=self.suffix)
            merge_states(o1=self.po, lse1=self.pl, o2=self.so, lse2=self.sl, out=self.o, out_lse=self.ol)
        return step

    def key(self) -> dict:
        return {"prefix": self.kind, "L": self.L, "B": self.B, "suffix": self.suffix}


def paged_reference(q, k_cache, v_cache, levels: list[dict], page: int) -> torch.Tensor:
    """float64 attention of each request over the tokens FlashInfer's page-table inputs name: for each level,
    the pages indices[indptr[i]:indptr[i+1]] of the sequence i whose qo range holds the request (last page
    `last[i]` tokens). Checks that the FlashInfer-side description is the problem our kernels solve."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        slots = []
        for lv in levels:
            qo = lv["qo"].cpu().long()
            i = int(torch.searchsorted(qo, torch.tensor(b), right=True)) - 1
            p = lv["indptr"].cpu().long()
            pages = lv["indices"].cpu().long()[p[i]:p[i + 1]]
            n = (len(pages) - 1) * page + int(lv["last"].cpu()[i])
            pos = torch.arange(n)
            slots.append(pages[pos // page] * page + pos % page)
        s = torch.cat(slots)
        o, _ = reference.attention(q[b:b + 1], k_cache[s.to(k_cache.device)], v_cache[s.to(v_cache.device)],
                                   1.0 / D ** 0.5)
        out[b] = o[0]
    return out


def decode_levels(p: DecodeProblem) -> list[dict]:
    return [{"qo": i32(torch.arange(p.B + 1)), "indptr": p.fi["indptr"], "indices": p.fi["indices"],
             "last": p.fi["last"]}]


def cascade_levels(p: CascadeProblem) -> list[dict]:
    return [{"qo": p.fi["qo"][i], "indptr": p.fi["indptr"][i], "indices": p.fi["indices"][i],
             "last": p.fi["last"][i]} for i in range(2)]


# ---------------------------------------------------------------------------------------------------------------
# FlashInfer (lazy): wrappers planned once per problem, run over the pool viewed as [pages, page, n_kv, d]

def fi_paged_cache(pool: Pool, page: int):
    n = pool.num_slots // page
    return (pool.k[:n * page].view(n, page, N_KV, D), pool.v[:n * page].view(n, page, N_KV, D))


def fi_decode(fi, ws, pool, p: DecodeProblem, tensor_cores: bool):
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    w.plan(p.fi["indptr"], p.fi["indices"], p.fi["last"], N_Q, N_KV, D, p.page,
           q_data_type=pool.dtype, kv_data_type=pool.dtype)
    cache = fi_paged_cache(pool, p.page)
    return lambda: w.run(p.q, cache)


def fi_cascade(fi, ws, pool, p: CascadeProblem, backend: str = "auto"):
    """FlashInfer's two-level cascade. 'auto': `MultiLevelCascadeAttentionWrapper` as it comes (its batch-prefill
    wrappers pick FA3 on Hopper, which does not split a level's KV). 'fa2': the same two levels through batch-prefill
    wrappers built with the FA2 backend (whose planner splits long KV) and `merge_state_in_place`, as that
    wrapper's run() combines them (the wrapper takes no backend argument in 0.6)."""
    cache = fi_paged_cache(pool, p.page)
    if backend == "auto":
        w = fi.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
        w.plan(p.fi["qo"], p.fi["indptr"], p.fi["indices"], p.fi["last"], N_Q, N_KV, D, p.page,
               q_data_type=pool.dtype, kv_data_type=pool.dtype)
        return lambda: w.run(p.q, cache)
    lv = [fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend) for _ in range(2)]
    for i, w in enumerate(lv):
        w.plan(p.fi["qo"][i], p.fi["indptr"][i], p.fi["indices"][i], p.fi["last"][i], N_Q, N_KV, D, p.page,
               causal=False, q_data_type=pool.dtype, kv_data_type=pool.dtype)

    def run():
        out, lse = lv[1].run(p.q, cache, return_lse=True)
        o0, l0 = lv[0].run(p.q, cache, return_lse=True)
        fi.merge_state_in_place(out, lse, o0, l0)
        return out
    return run


FI_CASCADES = {"cascade": "auto", "cascade_fa2": "fa2"}


# what the warm-up child ran (the parent uses only these): decode variant x page size, and the cascade
FI_VARIANTS = ("decode_cuda_cores_page1", "decode_tensor_cores_page1", "decode_cuda_cores_page16",
               "decode_tensor_cores_page16", "cascade", "cascade_fa2")


def fi_warm(out_path: str) -> None:
    """Child process: import FlashInfer and run each wrapper once on tiny problems (compiling its kernels into
    the JIT cache the parent then loads). Writes what worked and how long each step took."""
    res = {"steps": {}, "errors": {}}
    t0 = time.time()
    try:
        import flashinfer as fi
        res["version"] = fi.__version__
        res["import_s"] = round(time.time() - t0, 1)
    except Exception as e:  # noqa: BLE001
        res["errors"]["import"] = f"{type(e).__name__}: {e}"[:2000]
        json.dump(res, open(out_path, "w"), indent=1)
        return
    try:
        _warm_runs(fi, res, out_path)
    except Exception as e:  # noqa: BLE001
        res["errors"]["setup"] = f"{type(e).__name__}: {e}"[:2000]
    res["total_s"] = round(time.time() - t0, 1)
    json.dump(res, open(out_path, "w"), indent=1)


def _warm_runs(fi, res: dict, out_path: str) -> None:
    pool = Pool(4096)
    ws = torch.zeros(FI_WS_BYTES, dtype=torch.uint8, device="cuda")
    for page in (1, 16):
        d = DecodeProblem(pool, "slots" if page == 1 else "pages16", 64, 2)
        for v, tc in (("decode_cuda_cores", False), ("decode_tensor_cores", True)):
            t = time.time()
            try:
                o = fi_decode(fi, ws, pool, d, tc)()
                torch.cuda.synchronize()
                res["steps"][f"{v}_page{page}"] = {"s": round(time.time() - t, 1),
                                                   "diff_vs_ours": diff(o, d.ours(pool)()[0])}
            except Exception as e:  # noqa: BLE001
                res["errors"][f"{v}_page{page}"] = f"{type(e).__name__}: {e}"[:2000]
            json.dump(res, open(out_path, "w"), indent=1)
    c = CascadeProblem(pool, "pages16", 64, 2, 5, 1e9)
    c.ours(pool, "cascade")()
    for v, backend in FI_CASCADES.items():
        t = time.time()
        try:
            o = fi_cascade(fi, ws, pool, c, backend)()
            torch.cuda.synchronize()
            res["steps"][v] = {"s": round(time.time() - t, 1), "diff_vs_ours": diff(o, c.o)}
        except Exception as e:  # noqa: BLE001
            res["errors"][v] = f"{type(e).__name__}: {e}"[:2000]
        json.dump(res, open(out_path, "w"), indent=1)


class Compile:
    """The FlashInfer warm-up child, started at once and waited for with a deadline."""

    def __init__(self, out_dir: str, limit_s: float):
        self.path = os.path.join(out_dir, "flashinfer_build.json")
        if os.path.exists(self.path):
            os.remove(self.path)
        self.log = open(os.path.join(out_dir, "flashinfer_build.log"), "w")
        self.t0, self.limit = time.time(), limit_s
        self.proc = subprocess.Popen([sys.executable, "-m", "gpu_backend.bench.flashinfer_peer", "--fi-warm",
                                      self.path], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> dict:
        left = max(1.0, self.limit - (time.time() - self.t0))
        info = {"limit_s": self.limit}
        try:
            self.proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the child and its ninja / nvcc jobs
            self.proc.wait()
            info["reason"] = f"compiling took longer than {self.limit:.0f} s; FlashInfer skipped"
        info["seconds"] = round(time.time() - self.t0, 1)
        info["returncode"] = self.proc.returncode
        self.log.close()
        try:
            info.update(json.load(open(self.path)))
        except (OSError, ValueError):
            info.setdefault("reason", "the warm-up child wrote no result (see flashinfer_build.log)")
        ok = [k for k in info.get("steps", {}) if k not in info.get("errors", {})]
        info["usable"] = ok if "reason" not in info else []
        if not info["usable"] and "reason" not in info:
            info["reason"] = "no FlashInfer wrapper ran: " + "; ".join(f"{k}: {v[:300]}" for k, v in
                                                                      info.get("errors", {}).items())
        return info


# ---------------------------------------------------------------------------------------------------------------

def floors(p, ceil: dict) -> dict:
    copy_us = p.bytes / (ceil["copy_GBps"] * 1e9) * 1e6
    gemm_us = p.flops / (ceil["gemm_TFLOPs"] * 1e12) * 1e6
    return {"bytes": p.bytes, "flops": p.flops, "copy_floor_us": copy_us, "gemm_floor_us": gemm_us,
            "floor_us": max(copy_us, gemm_us), "bound": "copy" if copy_us >= gemm_us else "gemm"}


class Bench:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.g = grids(args.smoke)
        self.res = {"meta": meta(args), "grid": self.g, "errors": []}
        self.res["meta"]["flashinfer_peer"] = True

    def save(self):
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, "flashinfer_peer.json"), "w") as f:
            json.dump(self.res, f, indent=1)
        with open(os.path.join(self.args.out, "flashinfer_peer_summary.json"), "w") as f:
            json.dump(summarize(self.res), f, indent=1)

    def late(self, share: float) -> bool:
        return time.time() - self.t0 > share * self.args.budget_s

    def run(self):
        a, g = self.args, self.g
        cuda = torch.cuda.is_available()
        os.makedirs(a.out, exist_ok=True)
        comp = None
        if a.smoke or not cuda:
            self.res["flashinfer"] = {"usable": [], "reason": "no CUDA device (smoke run): FlashInfer skipped"}
        elif a.no_flashinfer:
            self.res["flashinfer"] = {"usable": [], "reason": "--no-flashinfer"}
        else:
            comp = Compile(a.out, a.fi_compile_s)
        self.res["ceilings"] = ceilings() if cuda else {"copy_GBps": 100.0, "gemm_TFLOPs": 1.0, "note": "smoke"}
        ceil = self.res["ceilings"]
        print(f"copy {ceil['copy_GBps']:.0f} GB/s, bf16 GEMM {ceil['gemm_TFLOPs']:.0f} TFLOP/s", flush=True)
        pool = self.pool = Pool(g["pool"])
        m_sat = m_sat_rows()
        self.res["m_sat"] = m_sat
        self.dec = [DecodeProblem(pool, k, Lc, B) for k in g["dec_kinds"] for Lc in g["dec_L"] for B in g["dec_B"]
                    if B * Lc <= pool.num_slots]
        self.cas = [CascadeProblem(pool, k, Lc, B, g["suffix"], m_sat) for k in g["cas_kinds"] for Lc in g["cas_L"]
                    for B in g["cas_B"]]
        # phase A: ours alone (the figures kept if FlashInfer cannot run), checked against a float64 reference
        dec_rows, cas_rows, checked = [], [], set()
        for p in self.dec:
            r = {**p.key(), **floors(p, ceil)}
            fn = p.ours(pool)
            fn()
            if a.smoke or p.kind not in checked:  # the first point of each storage (every point in smoke runs)
                checked.add(p.kind)
                ref = paged_reference(p.q, pool.k, pool.v, decode_levels(p), p.page)
                r["ours_max_abs_diff_vs_reference"] = diff(p.out.cpu(), ref)
            r["ours"] = timed(fn)
            dec_rows.append(r)
            print(f"decode page {p.page:2d} L {p.L:6d} B {p.B:4d}: ours {r['ours']['us']:9.1f} us "
                  f"({r['copy_floor_us'] / r['ours']['us']:.0%} of copy)", flush=True)
        self.res["decode"] = {"rows": dec_rows}
        for p in self.cas:
            r = {**p.key(), "engine_path": p.path, **floors(p, ceil)}
            paths = ["cascade", "dense"] if p.kind == "slab" else ["cascade"]
            for path in paths:
                fn = p.ours(pool, path)
                fn()
                if path == "cascade" and (a.smoke or "c_" + p.kind not in checked):
                    checked.add("c_" + p.kind)
                    ref = paged_reference(p.q, pool.k, pool.v, cascade_levels(p), 16)
                    r["ours_max_abs_diff_vs_reference"] = diff(p.o.cpu(), ref)
                r[f"ours_{path}"] = timed(fn)
            r["ours"] = r[f"ours_{p.path}"]
            cas_rows.append(r)
            print(f"cascade {p.kind:7s} L {p.L:6d} B {p.B:4d}: ours ({p.path}) {r['ours']['us']:9.1f} us, "
                  f"x floor {r['ours']['us'] / r['floor_us']:.2f} ({r['bound']})", flush=True)
        self.res["cascade"] = {"rows": cas_rows}
        self.res["phase_a_s"] = round(time.time() - self.t0, 1)
        self.save()
        if comp is not None:
            self.res["flashinfer"] = comp.wait()
            print("flashinfer:", {k: v for k, v in self.res["flashinfer"].items() if k != "errors"}, flush=True)
            for k, v in self.res["flashinfer"].get("errors", {}).items():
                print(f"  flashinfer error {k}: {v[:500]}", flush=True)
            self.save()
        if self.res["flashinfer"]["usable"]:
            self.peer(dec_rows, cas_rows)
        elif cuda and not a.smoke:
            self.res["flex"] = self.flex(ceil)
        self.res["seconds"] = round(time.time() - self.t0, 1)
        self.save()
        print_table(summarize(self.res))

    def peer(self, dec_rows, cas_rows):
        """phase B: FlashInfer on every problem, ours re-timed next to it."""
        import flashinfer as fi
        pool, usable = self.pool, self.res["flashinfer"]["usable"]
        ws = torch.zeros(FI_WS_BYTES, dtype=torch.uint8, device="cuda")
        dec, cas = list(zip(self.dec, dec_rows)), list(zip(self.cas, cas_rows))
        order = [x for pair in itertools.zip_longest(dec, cas) for x in pair if x is not None]
        for p, r in order:  # decode and cascade points alternate, so a run cut short keeps both kinds
            if self.late(0.97):
                self.res["decode" if isinstance(p, DecodeProblem) else "cascade"]["truncated"] = True
                continue
            if isinstance(p, DecodeProblem):
                self.peer_decode(fi, ws, p, r, usable)
            elif any(v in usable for v in FI_CASCADES):
                self.peer_cascade(fi, ws, p, r, usable)
            self.save()

    def peer_decode(self, fi, ws, p, r, usable):
        pool = self.pool
        fn = p.ours(pool)
        fn()
        variants = {v: (lambda tc=tc: fi_decode(fi, ws, pool, p, tc)) for v, tc in
                    (("decode_cuda_cores", False), ("decode_tensor_cores", True)) if f"{v}_page{p.page}" in usable}
        fis = _time_variants(r, variants, fn, p.out.clone())
        print(f"decode page {p.page:2d} L {p.L:6d} B {p.B:4d}: ours {r['ours_again']['us']:9.1f} us, "
              + ", ".join(f"FI {k} {u:9.1f} us" for k, u in fis.items()), flush=True)

    def peer_cascade(self, fi, ws, p, r, usable):
        pool = self.pool
        fn = p.ours(pool, p.path)
        fn()
        variants = {v: (lambda b=backend: fi_cascade(fi, ws, pool, p, b)) for v, backend in FI_CASCADES.items()
                    if v in usable}
        fis = _time_variants(r, variants, fn, p.o.clone())
        print(f"cascade {p.kind:7s} L {p.L:6d} B {p.B:4d}: ours ({p.path}) {r['ours_again']['us']:9.1f} us, "
              + ", ".join(f"FI {k} {u:9.1f} us" for k, u in fis.items()) + f"; floor {r['floor_us']:.1f} us",
              flush=True)

    def flex(self, ceil) -> dict:
        """FlexAttention paged decode (page 128, its block size) on the decode grid, ours on its head-major layout."""
        from . import peers
        rows, ps, n_pages = [], 128, 16000  # 2M tokens: Flex's int64-index path did not compile for larger caches
        try:
            kp = torch.randn(1, N_KV, n_pages * ps, D, device="cuda", dtype=torch.bfloat16)
            vp = torch.randn_like(kp)
            for Lc in self.g["dec_L"]:
                for B in self.g["dec_B"]:
                    P = Lc // ps
                    if B * P > n_pages or self.late(0.97):
                        continue
                    pages = torch.randperm(n_pages, device="cuda")[:B * P].view(B, P).to(torch.int32)
                    q = queries(B, N_Q, torch.bfloat16)
                    f = peers.flex_paged(q, kp, vp, pages, ps)
                    kc, vc = kp[0].permute(1, 0, 2), vp[0].permute(1, 0, 2)
                    kv = L.PageTable(i32(torch.arange(B + 1) * P), pages.flatten(), i32([Lc] * B), ps)
                    ours = lambda: decode_attention(q=q, k_cache=kc, v_cache=vc, kv=kv, check=False,  # noqa: E731
                                                    max_kv_len=Lc)
                    r = {"page": ps, "L": Lc, "B": B, "copy_floor_us": B * Lc * KV_BYTES_PER_TOKEN /
                         (ceil["copy_GBps"] * 1e9) * 1e6, "max_abs_diff_vs_ours": diff(f()[:, :, 0], ours()[0])}
                    r["flex"], r["ours_same_layout"] = timed(f), timed(ours)
                    rows.append(r)
                    print(f"flex L {Lc} B {B}: {r['flex']['us']:.1f} us; ours {r['ours_same_layout']['us']:.1f} us",
                          flush=True)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            return {"rows": rows, "error": f"{type(e).__name__}: {e}"[:1000]}
        return {"rows": rows}


# ---------------------------------------------------------------------------------------------------------------

def _with_fi(s: dict, r: dict, variants, ours: dict, floor_us: float) -> dict:
    """A summary row ``s`` with each FlashInfer variant's time of raw row ``r``, and the fastest one's figures."""
    for v in variants:
        if f"fi_{v}" in r:
            s[f"fi_{v}_us"] = r[f"fi_{v}"]["us"]
    if "fi_best" in r:
        b = r[f"fi_{r['fi_best']}"]
        s.update(fi_us=b["us"], fi_p10_p90=[b["p10_us"], b["p90_us"]], fi_variant=r["fi_best"],
                 fi_x_floor=b["us"] / floor_us, fi_over_ours=b["us"] / ours["us"])
    return s


def summarize(res: dict) -> dict:
    """The table's rows: per point our time, FlashInfer's (its faster decode variant), the floor, the ratios."""
    fi = res.get("flashinfer", {})
    out = {"meta": {k: res["meta"].get(k) for k in ("date", "commit", "gpu", "torch", "triton", "python", "cuda",
                                                       "smoke")},
           "ceilings": {k: res.get("ceilings", {}).get(k) for k in ("copy_GBps", "gemm_TFLOPs")},
           "flashinfer": {k: fi.get(k) for k in ("version", "usable", "reason", "seconds") if k in fi},
           "m_sat": res.get("m_sat"), "decode": [], "cascade": [], "flex": []}
    for r in res.get("decode", {}).get("rows", []):
        ours = r.get("ours_again", r["ours"])
        s = {"page": r["page"], "L": r["L"], "B": r["B"], "ours_us": ours["us"], "ours_p10_p90": [ours["p10_us"],
             ours["p90_us"]], "floor_us": r["copy_floor_us"], "ours_x_floor": ours["us"] / r["copy_floor_us"]}
        out["decode"].append(_with_fi(s, r, ("decode_cuda_cores", "decode_tensor_cores"), ours, r["copy_floor_us"]))
    for r in res.get("cascade", {}).get("rows", []):
        ours = r.get("ours_again", r["ours"])
        s = {"prefix": r["prefix"], "L": r["L"], "B": r["B"], "suffix": r["suffix"], "engine_path": r["engine_path"],
             "ours_us": ours["us"], "ours_p10_p90": [ours["p10_us"], ours["p90_us"]],
             "ours_cascade_us": r["ours_cascade"]["us"], "floor_us": r["floor_us"], "bound": r["bound"],
             "copy_floor_us": r["copy_floor_us"], "ours_x_floor": ours["us"] / r["floor_us"]}
        if "ours_dense" in r:
            s["ours_dense_us"] = r["ours_dense"]["us"]
        out["cascade"].append(_with_fi(s, r, FI_CASCADES, ours, r["floor_us"]))
    rows = res.get("decode", {}).get("rows", []) + res.get("cascade", {}).get("rows", [])
    tail = "_max_abs_diff_vs_ours"
    diffs = {k[3:-len(tail)]: [r[k] for r in rows if k in r]
             for k in sorted({k for r in rows for k in r if k.startswith("fi_") and k.endswith(tail)})}
    out["max_abs_diff_vs_ours"] = {v: max(d) for v, d in diffs.items() if d}  # every point checked before timing
    out["modes"] = sorted({t["mode"] for r in rows for t in r.values() if isinstance(t, dict) and "mode" in t})
    for r in res.get("flex", {}).get("rows", []):
        out["flex"].append({"page": r["page"], "L": r["L"], "B": r["B"], "flex_us": r["flex"]["us"],
                            "ours_us": r["ours_same_layout"]["us"], "floor_us": r["copy_floor_us"],
                            "flex_over_ours": r["flex"]["us"] / r["ours_same_layout"]["us"]})
    return _rounded(out)


def _rounded(x):
    """Floats to 4 significant digits (the summary is committed; the full JSON keeps every digit)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def print_table(s: dict) -> None:
    f = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    print("\nFlashInfer:", s["flashinfer"])
    print(f"\n{'decode':8s} {'page':>4s} {'L':>6s} {'B':>4s} {'ours us':>9s} {'FI us':>9s} {'floor':>8s} "
          f"{'ours/fl':>7s} {'FI/fl':>7s} {'FI/ours':>7s}  FI variant")
    for r in s["decode"]:
        print(f"{'':8s} {r['page']:4d} {r['L']:6d} {r['B']:4d} {r['ours_us']:9.1f} {f(r.get('fi_us')):>9s} "
              f"{r['floor_us']:8.1f} {r['ours_x_floor']:7.2f} {r.get('fi_x_floor', float('nan')):7.2f} "
              f"{r.get('fi_over_ours', float('nan')):7.2f}  {r.get('fi_variant', '-')}")
    print(f"\n{'cascade':8s} {'prefix':>7s} {'L':>6s} {'B':>4s} {'ours us':>9s} {'FI us':>9s} {'floor':>8s} "
          f"{'ours/fl':>7s} {'FI/fl':>7s} {'FI/ours':>7s}  path, bound, FI variant")
    for r in s["cascade"]:
        print(f"{'':8s} {r['prefix']:>7s} {r['L']:6d} {r['B']:4d} {r['ours_us']:9.1f} {f(r.get('fi_us')):>9s} "
              f"{r['floor_us']:8.1f} {r['ours_x_floor']:7.2f} {r.get('fi_x_floor', float('nan')):7.2f} "
              f"{r.get('fi_over_ours', float('nan')):7.2f}  {r['engine_path']}, {r['bound']}, "
              f"{r.get('fi_variant', '-')}")
    for r in s["flex"]:
        print(f"flex page {r['page']} L {r['L']} B {r['B']}: flex {r['flex_us']:.1f} us, ours {r['ours_us']:.1f} us")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--commit", default=os.environ.get("COMMIT", "unknown"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU interpreter), FlashInfer skipped")
    ap.add_argument("--budget-s", type=float, default=480.0, help="whole run's time budget (s)")
    ap.add_argument("--fi-compile-s", type=float, default=330.0, help="time limit of FlashInfer's compilation (s)")
    ap.add_argument("--no-flashinfer", action="store_true", help="time ours (and FlexAttention) only")
    ap.add_argument("--fi-warm", metavar="JSON", help=argparse.SUPPRESS)  # the compiling child
    args = ap.parse_args(argv)
    if args.fi_warm:
        fi_warm(args.fi_warm)
        return 0
    if not args.out:
        ap.error("--out is required")
    Bench(args).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
