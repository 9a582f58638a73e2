"""Calibration microbenchmarks: raw timings of one model's operators on this GPU, as CSV.

    PYTHONUNBUFFERED=1 python -m calibration.measure --gpu h200 --model llama-3.1-8b --out DIR
    TRITON_INTERPRET=1 python -m calibration.measure --smoke --out /tmp/cal     # CPU, tiny sizes

Writes DIR/meta.json (date, commit, GPU, versions, command, ceilings) and DIR/{linear,attention,
overhead}.csv. Imports only torch, triton, gpu_backend, granisim.config.models (plain dataclasses) and
the standard library, so it runs on a bare GPU image without the simulator's dependencies.

What is timed (bf16, random data, CUDA-event medians with p10/p90 over graph replays):

* linear.csv — the model's linear operators as torch ops at its shapes over 1..16K tokens: the
  QKV, O, gate/up, down GEMMs and the LM head (``F.linear``), RMS norm, SiLU-and-mul, RoPE
  (rotate-half), residual add, embedding.
* attention.csv — every attention path and KV kernel through OUR Triton kernels: decode over
  page size 1 / pages of 16 / a slab; cascade over slab / slots / pages of 16; dense over a slab;
  extend (prefill) over each storage and an empty prefix; LSE merge; KV write; KV copy.
  Each row records the launch parameters the launcher chose (row tile, KV tile, warps, splits,
  chunk, programs), so a fit can follow the kernel's own rules.
* overhead.csv — one decode step's whole launch sequence (32 layers) run eagerly vs as a CUDA
  graph replay, plus the host work of building a step's metadata.

Timing rule: a point's operator is called ``k`` times in one CUDA graph, each call on a
different copy of its data (a different KV region / weight copy, like the model's layers), with
``k`` large enough that the ``k`` copies exceed the L2 several times over (at most 32); one
replay's time / ``k`` is one sample. Inter-kernel gaps inside a graph are included, host launch
cost is not (that is the overhead section's business).
"""

from .cli import main

__all__ = ["main"]
