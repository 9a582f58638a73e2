"""Profile documents from a fit (every coefficient ``measured``) and what-if profiles derived from
a measured one by datasheet ratios (every coefficient ``extrapolated``, with the ratios)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from granisim.config.coefficients import COEFFICIENTS, KERNEL_MODEL_COEFFICIENTS, L2_STREAMS
from granisim.config.hardware import SCHEMA
from granisim.config.models import get_model

from .fit import DISCRETE, FAMILY_PARAMS, KERNEL_RULES, FitResult
from .raw import Raw, measured_source, unit_of

GIB = 2**30

# Datasheets (dense bf16 tensor-core rate, HBM bandwidth, SMs, memory) of the GPUs we derive for.
DATASHEETS = {
    "h200": dict(gpu="NVIDIA H200 SXM 141GB", mem_gib=141, bw=4.8e12, flops=989e12, sms=132,
                 sheet="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 4.8 TB/s, BF16 989 TFLOPS dense, 141 GB"),
    "h100-sxm": dict(gpu="NVIDIA H100 SXM5 80GB", mem_gib=80, bw=3.35e12, flops=989e12, sms=132,
                     sheet="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): 3.35 TB/s, BF16 989 TFLOPS dense, 80 GB; "
                           "H100 whitepaper: 132 SMs"),
    "b200": dict(gpu="NVIDIA B200 180GB", mem_gib=180, bw=8.0e12, flops=2250e12, sms=148,
                 sheet="NVIDIA HGX B200 datasheet (B200): 8 TB/s, FP16/BF16 2.25 PFLOPS dense, 180 GB; "
                       "Blackwell technical brief: 148 SMs"),
}


def _family_of(name: str) -> str | None:
    for fam, ps in FAMILY_PARAMS.items():
        if any(n == name for n, _, _ in ps):
            return fam
    for fam, n in DISCRETE.items():
        if n == name:
            return fam
    return None


def _err_txt(errors: dict, fam: str) -> str:
    raw_fam = {"prefill": "extend"}.get(fam, fam)
    e = errors.get(raw_fam, {}).get("heldout")
    if not e or not e.get("n"):
        return ""
    return f"; held-out error median {e['median']:.1%}, p90 {e['p90']:.1%} (n={e['n']})"


def _how(name: str, res: FitResult) -> str:
    if name in res.notes:
        return res.notes[name]
    fam = _family_of(name)
    if fam == "storage":
        return ("fitted (granisim.calibration.fit) on the decode and cascade rows over slot lists and pages of 16, "
                "the kernels' own coefficients held fixed")
    if fam is not None:
        what = "whole-number value with the least error, tried one by one" if name in DISCRETE.values() else \
            "bounded least squares (scipy TRF) on log(predicted / measured), all rows"
        return f"fitted (granisim.calibration.fit, family {fam}: {what}){_err_txt(res.errors, fam)}"
    if name == "attn.decode.flop_eff":
        return "set equal to attn.cascade.flop_eff: decode (G query rows per KV head) is never compute-bound"
    if name.startswith("linear."):
        fam = name.split(".")[1]
        e = res.errors.get(f"linear.{fam}", {}).get("heldout", {})
        return ("roofline fit (granisim.costmodel.fit_roofline, relative error, launch_s <= 20 us) of the torch op "
                f"over 1..16K tokens; held-out error median {e.get('median', float('nan')):.1%}, "
                f"p90 {e.get('p90', float('nan')):.1%}"
                + ("; this profile uses the measured table for these operators (linear_table), the roofline "
                   "carries to other GPUs" if fam != "lm_head" else ""))
    if name == "storage.slab_eff":
        return "1 by definition: slab rows are the reference the kernels' mem_eff are fitted on"
    if name in ("attn.cascade.balance_chunk", "attn.cascade.balance_skew"):
        return ("the launchers' load-balance rule (gpu_backend/kernels/split_kv.py BALANCE_*, chosen by "
                "gpu_backend/bench/split_balance.py on the H200, reports/kernels/split_balance/); added after the "
                "calibration runs, it leaves every calibration row's split count as recorded (equal lengths: "
                "cap >= length)")
    if name == "attn.prefill.resident_ctas_per_sm":
        return ("the prefill kernel's 128-row tiles leave shared memory for one program per SM (gpu_backend/kernels/"
                "extend.py default_tiles: 8 warps, 3 stages of 128-token K and V tiles); Qwen-2.5-14B's 160-program "
                "prefills take 1.8-1.9x the time of 128 programs on an H100 (calibration/raw/h100/"
                "qwen-2.5-14b_extend), which 2 resident programs per SM would price at 1.2x")
    if name in KERNEL_RULES:
        sc = res.split_check
        return (f"the launchers' rule at the measured commit (gpu_backend/kernels); calibration rows are priced "
                f"with the split counts they recorded, which the cost model's split rule reproduces on "
                f"{sc.get('agree', 0)}/{sc.get('rows', 0)} rows")
    if name == "overhead.kernel_launch_s":
        return "median of the fitted merge and KV-write launch times (used by form-1 formulas only)"
    return "measured"


def profile_doc(raw: Raw, res: FitResult, *, name: str, command: str, table_prefix: str) -> dict:
    """The profile JSON (dict) of a fit; tables are referenced as ``{table_prefix}_linear_ops.csv`` and
    ``{table_prefix}_kernels.csv`` (written by :func:`write_profile`)."""
    m = raw.meta
    versions = measured_source(m)["versions"]

    def src(note=None):
        return measured_source(m, command, note)

    mod = get_model(m.get("model", "llama-3.1-8b"))
    dims = mod.table_shape()
    coefs = {}
    for k in list(COEFFICIENTS) + list(KERNEL_MODEL_COEFFICIENTS):
        if k in OTHER_RUNS:
            continue
        v = res.values[k]
        unit = unit_of(k)
        rule = COEFFICIENTS.get(k, KERNEL_MODEL_COEFFICIENTS.get(k, ("", "")))[1]
        if rule == "int":
            v = int(round(v))
        elif isinstance(v, float):
            v = float(f"{v:.6g}")
        coefs[k] = {"value": v, "unit": unit, "source": src(_how(k, res))}
    coefs["memory_bytes"]["source"] = src("torch.cuda.get_device_properties(0).total_memory")
    coefs["sm_count"]["source"] = src("torch.cuda.get_device_properties(0).multi_processor_count")
    coefs["bf16_flops"]["source"] = src("bf16 8192^3 torch matmul, random normal data, CUDA-graph replays (median)")
    return {
        "schema": SCHEMA,
        "name": name,
        "gpu": m.get("gpu", name),
        "notes": (f"Measured profile: calibration run of {m.get('date', '?')} on {m.get('gpu', '?')} "
                  f"(commit {m.get('commit', '?')}, {versions}), fitted by granisim.calibration. Attention and KV "
                  "kernels: form-2 formulas (attn.form = 2: the Triton kernels' own split and tile rules, a wave "
                  "model of their programs) times the measured/formula ratio interpolated over the kernel table; "
                  "linear operators: the measured table (torch ops at the model's shapes), scaled to other models "
                  "by roofline ratios; LM head: roofline. See reports/calibration/."),
        "linear_table": {"file": f"{table_prefix}_linear_ops.csv", "model": dims,
                         "scaling": ("t_model(n) = t_table(n) * max(F_model(n)/P, B_model(n)/BW) / max(F_table(n)/P, "
                                     "B_table(n)/BW) per operator; linear interpolation in num_tokens"),
                         "source": src("torch ops at Llama-3.1-8B shapes over 1..16K tokens, CUDA-graph medians")},
        "kernel_table": {"file": f"{table_prefix}_kernels.csv", "model": dims,
                         "source": src("calibration.measure attention.csv: our Triton kernels, per layer")},
        "coefficients": coefs,
    }


# coefficients this run does not measure, left out (their defaults hold) until their own measurement writes them:
# the skewed decode's factor (granisim calibrate skew, from the split-balance benchmark)
OTHER_RUNS = ("attn.decode.skew_stream",)

KERNEL_CSV_COLS = ["family", "storage", "G", "B", "L", "M_eff", "q_len", "n_req", "T", "n_splits", "programs",
                   "median_us", "p10_us", "p90_us"]


def write_profile(doc: dict, raw: Raw, res: FitResult, out: str | Path, extra_dirs=()) -> Path:
    """Write the profile JSON and its two tables beside it (and the tables into ``extra_dirs``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lin = out.parent / doc["linear_table"]["file"]
    ker = out.parent / doc["kernel_table"]["file"]
    res.linear_table.to_csv(lin, index=False, float_format="%.6g")
    att = raw.attention
    att[[c for c in KERNEL_CSV_COLS if c in att.columns]].to_csv(ker, index=False, float_format="%.6g")
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for d in extra_dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
        for f in (lin, ker):
            if Path(d).resolve() != f.parent.resolve():
                shutil.copyfile(f, Path(d) / f.name)
    return out


def derive(doc: dict, target: str, *, source_name: str) -> dict:
    """A what-if profile for ``target`` (a DATASHEETS key) from a measured profile ``doc`` of GPU
    ``doc['name']`` (also in DATASHEETS): rates scaled by datasheet ratios, everything else carried."""
    base, ds = DATASHEETS[doc["name"]], DATASHEETS[target]
    c0 = doc["coefficients"]
    rb, rf, rs = ds["bw"] / base["bw"], ds["flops"] / base["flops"], ds["sms"] / base["sms"]
    frm = f"{source_name} (measured {c0['hbm_bandwidth']['source'].get('date', '?')})"
    ridge = (ds["flops"] / ds["bw"]) / (base["flops"] / base["bw"])

    def ext(how):
        return {"kind": "extrapolated", "from": frm, "how": how}

    coefs = {}
    for k, c in c0.items():
        v = c["value"]
        if k == "hbm_bandwidth":
            v, how = v * rb, f"measured H200 stream rate x datasheet bandwidth ratio {ds['bw'] / 1e12:g}/{base['bw'] / 1e12:g} = {rb:.4f}"
        elif k == "bf16_flops":
            v, how = v * rf, (f"measured H200 GEMM rate x datasheet dense bf16 ratio {ds['flops'] / 1e12:g}/"
                              f"{base['flops'] / 1e12:g} = {rf:.4f}")
        elif k == "sm_count":
            v, how = ds["sms"], f"datasheet: {ds['sheet']} (ratio to H200 {rs:.3f}: the wave model's SM count)"
        elif k == "memory_bytes":
            v, how = ds["mem_gib"] * GIB, f"datasheet: {ds['sheet']} (GB read as GiB, as nvidia-smi reports)"
        elif k == "m_sat":
            v = int(round(v * ridge))
            how = (f"measured H200 M_sat x the ratio of tensor-core-rate/bandwidth ridges, "
                   f"({ds['flops'] / 1e12:g}T/{ds['bw'] / 1e12:g}TB/s) / ({base['flops'] / 1e12:g}T/"
                   f"{base['bw'] / 1e12:g}TB/s) = {ridge:.3f}")
        elif k in L2_STREAMS:
            v = v * rs / rb
            how = (f"the measured H200 rate in bytes/s x the SM ratio {rs:.3f} (expressed against this GPU's "
                   f"bandwidth: x{rs:.3f}/{rb:.4f}): a launch's query tiles re-read each head's K/V from L2, whose "
                   "rate follows the SMs, not HBM (an H100 ran the H200's extend rows at 0.97-1.01x its time with "
                   "0.73x the bandwidth; reports/calibration/README.md section 7)")
        elif k.startswith("overhead.") or k.endswith("launch_s") or k.endswith("program_s"):
            how = "same as the measured H200: host work, launch and per-program latencies do not follow datasheet rates"
        elif c["unit"] in ("rows", "CTAs", "tokens", "kernels", "splits", ""):
            how = ("same as the measured H200: the same kernels with the same tiling/split rules reach the same "
                   "fraction of this GPU's rates (efficiencies are fractions of bf16_flops / hbm_bandwidth)")
        else:
            how = "same as the measured H200"
        if isinstance(v, float):
            v = float(f"{v:.6g}")
        coefs[k] = {"value": v, "unit": c["unit"], "source": ext(how)}
    return {
        "schema": SCHEMA,
        "name": target,
        "gpu": ds["gpu"],
        "notes": (f"What-if profile derived from the measured {doc['name']} profile ({source_name}) by datasheet "
                  f"ratios: HBM bandwidth x{rb:.4f}, bf16 tensor-core rate x{rf:.4f}, SMs {ds['sms']} "
                  f"(x{rs:.3f}), memory {ds['mem_gib']} GB; the prefill pass's K/V re-read rate x the SM ratio "
                  "(served from L2); every other efficiency, latency and kernel rule carried over "
                  "unchanged; formulas only (the H200 kernel table's measured corrections are not carried). "
                  f"Datasheets: {base['sheet']} / {ds['sheet']}. Re-fit on the real GPU with "
                  "`python -m calibration.measure` + `granisim calibrate fit` (README)."),
        "coefficients": coefs,
    }
