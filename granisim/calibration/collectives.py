"""Tensor-parallel and MoE coefficients of the shipped profiles, from published data until measured.

    python -m granisim.calibration.collectives          # adds / refreshes them in granisim/config/profiles/*.json

Run after the profiles are regenerated (``granisim.calibration.shipped`` and ``.published`` call
:func:`add_to_file` themselves). Nothing here is measured yet: a machine with several GPUs will measure
the all-reduce curve (nccl-tests ``all_reduce_perf``) and a single H200 the grouped GEMM
(``python -m calibration.measure --only grouped_gemm``, fitted by :func:`granisim.calibration.moe_fit.fit`);
until then:

**All-reduce** ``comm.allreduce.tp{n}.{latency_s,busbw}`` for n = 2, 4, 8 (all GPUs of one NVSwitch host):
``t(S) = latency_s + S * 2 (n-1)/n / busbw`` — nccl-tests' bus-bandwidth definition
(NVIDIA/nccl-tests doc/PERFORMANCE.md: an all-reduce's ``busbw = algbw * 2 (n-1)/n``). ``busbw`` is
80% of the GPU's unidirectional NVLink bandwidth (half the datasheet's bidirectional figure): 8-GPU
nccl-tests runs report large-message all-reduce bus bandwidths of 230-250 GB/s on A100 (NVLink 3,
300 GB/s per direction) and 360-480 GB/s on H100 (NVLink 4, 450 GB/s per direction; the top of the
range with NVLink SHARP), so 80% sits at the conservative end. ``latency_s`` is the small-message floor
of an all-reduce within one NVSwitch host (a few microseconds; NCCL's LL protocol, vLLM's custom
all-reduce), growing with the GPU count. Every value is marked ``extrapolated`` with this derivation.

**MoE grouped GEMM** ``linear.moe_{up,down}.*``: copies of the dense ``linear.mlp_up`` /
``linear.mlp_down`` roofline coefficients (marked ``extrapolated``): a grouped GEMM over the active
experts priced as the dense GEMM of the same FLOPs and bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from granisim.config.coefficients import TP_DEGREES
from granisim.config.profile_base import reference
from granisim.config.hardware import PROFILE_DIR

# GPU name (substring of a profile's "gpu") -> (datasheet citation, bidirectional NVLink bytes/s per GPU)
NVLINK = {
    "A100": ("NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s (bidirectional)", 600e9),
    "H100": ("NVIDIA H100 Tensor Core GPU datasheet: SXM NVLink 900 GB/s (bidirectional)", 900e9),
    "H200": ("NVIDIA H200 Tensor Core GPU datasheet: NVLink 900 GB/s (bidirectional)", 900e9),
    "B200": ("NVIDIA DGX B200 / HGX B200 datasheet: fifth-generation NVLink 1.8 TB/s per GPU (bidirectional)",
             1.8e12),
}
BUS_FRACTION = 0.8
LATENCY_S = {2: 6e-6, 4: 8e-6, 8: 10e-6}
NCCL_TESTS = "NVIDIA/nccl-tests doc/PERFORMANCE.md (all-reduce busbw = algbw x 2(n-1)/n)"


def _ext(frm: str, how: str) -> dict:
    return {"kind": "extrapolated", "from": frm, "how": how}


def parallel_coefficients(doc: dict, m_sat_ratios: dict | None = None) -> dict:
    """The tp and MoE coefficients for one profile document (keys -> coefficient entries); ``m_sat_ratios``
    (tp -> ratio, :func:`m_sat_ratios`) adds the per-tp M_sat."""
    gpu = doc["gpu"]
    key = next((k for k in NVLINK if k in gpu), None)
    out: dict = {}
    if key is not None:
        cite, bidir = NVLINK[key]
        busbw = BUS_FRACTION * bidir / 2.0
        for n in TP_DEGREES:
            out[f"comm.allreduce.tp{n}.busbw"] = {"value": busbw, "unit": "B/s", "source": _ext(
                f"{cite}; {NCCL_TESTS}",
                f"{BUS_FRACTION:.0%} of the unidirectional NVLink bandwidth ({bidir / 2e9:.0f} GB/s); "
                "not measured (needs a machine with several GPUs)")}
            out[f"comm.allreduce.tp{n}.latency_s"] = {"value": LATENCY_S[n], "unit": "s", "source": _ext(
                NCCL_TESTS, f"small-message all-reduce floor assumed for {n} GPUs on one NVSwitch host; not measured")}
    coefs = doc["coefficients"]
    if m_sat_ratios is not None:
        for n in TP_DEGREES:
            out[f"m_sat.tp{n}"] = {"value": int(round(coefs["m_sat"]["value"] * m_sat_ratios[n])), "unit": "rows",
                                   "source": _ext(f"{doc['name']} m_sat", (
                                       f"x {m_sat_ratios[n]:.2f}: the cost model's best dense/cascade threshold "
                                       f"(granisim.costmodel.m_sat_threshold, Llama-3.1-8B, L_p = 16K) on one GPU's "
                                       f"shard at tp = {n} over that at tp = 1"))}
    for fam, dense in (("up", "mlp_up"), ("down", "mlp_down")):
        for k in ("launch_s", "flop_eff", "mem_eff"):
            src = coefs[f"linear.{dense}.{k}"]
            out[f"linear.moe_{fam}.{k}"] = {"value": src["value"], "unit": src["unit"], "source": _ext(
                f"{doc['name']} linear.{dense}.{k}",
                "the dense GEMM roofline; the grouped GEMM is not measured on this GPU yet")}
    return out


def m_sat_ratios(path: Path) -> dict:
    """tp -> the cost model's dense/cascade threshold on a tp shard over that at tp = 1 (Llama-3.1-8B, 16K)."""
    from granisim.config.hardware import load_profile
    from granisim.config.models import get_model
    from granisim.costmodel import m_sat_threshold

    prof, m = load_profile(path), get_model("llama-3.1-8b")
    base = m_sat_threshold(prof, m, 16384)
    return {n: m_sat_threshold(prof, m.shard(n), 16384) / base for n in TP_DEGREES}


def add_to_doc(doc: dict, ratios: dict | None = None) -> dict:
    """``doc`` with the tp and MoE coefficients added (existing measured ones are kept)."""
    coefs = doc["coefficients"]
    for k, v in parallel_coefficients(doc, ratios).items():
        if coefs.get(k, {}).get("source", {}).get("kind") != "measured":
            coefs[k] = v
    return doc


def add_to_file(path: Path) -> None:
    doc = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps(add_to_doc(doc), indent=2) + "\n")  # first without: loadable
    doc = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps(add_to_doc(doc, m_sat_ratios(path)), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    from granisim.config.files import OneLineParser

    ap = OneLineParser(prog="python -m granisim.calibration.collectives",
                       description="Add or refresh the extrapolated tensor-parallel and MoE coefficients of "
                                   "profile files in place (measured ones are kept).")
    ap.add_argument("profiles", nargs="*", help="profile JSON files (default: every shipped profile, "
                                                "granisim/config/profiles/*.json)")
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.profiles] or sorted(PROFILE_DIR.glob("*.json"))
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:  # before any file is rewritten
        print(f"error: {missing}: no such profile file", file=sys.stderr)
        return 2
    made_from = {p: reference(json.loads(p.read_text())) for p in paths}  # these inherit their base's
    given = next((p for p in paths if made_from[p]), None) if args.profiles else None
    if given is not None:
        print(f"error: {given}: made from {made_from[given]}, whose tp / MoE coefficients it inherits: refresh "
              f"the base instead", file=sys.stderr)
        return 2
    for p in (p for p in paths if not made_from[p]):
        add_to_file(p)
        print(f"tp / MoE coefficients: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
