"""A step's attention launches, prepared once per step and run once per layer.

Every layer of a step launches the same kernels over the same metadata with the same grids;
only the layer's q/K/V tensors change. So the host work of each launcher (split counts, grids,
argument tuples, scratch buffers) is done once here, from the step's metadata and shape, and
the per-layer loop only launches (the plan/run split of FlashInfer's wrappers). On an eager mixed
step of ~1K prefill rows plus decodes this host work, repeated per layer, was as long as the
device's attention time (gpu_backend/bench/eager_stalls.py measures it).

Scratch (attention output, LSEs, the prefix and suffix halves) is allocated once per step and
reused by every layer: layers run one after another on one stream. Built inside `_forward`, so a
captured graph allocates it from its own pool.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from granisim.config.models import ModelShape

from ..kernels.cascade import cascade_launch
from ..kernels.decode import decode_launch
from ..kernels.dense import DenseLaunch
from ..kernels.extend import ExtendLaunch
from ..kernels.kv_write import KvWriteLaunch
from ..kernels.merge import MergeLaunch
from ..kernels.split_kv import SplitKvLaunch
from .metadata import StepMeta


@dataclass
class PassLaunch:
    lo: int  # the pass's rows, relative to the first grouped row
    hi: int
    launch: SplitKvLaunch | DenseLaunch


class StepLaunches:
    """`fold_merge`: each prefix pass merges the suffix half in its combine (the suffix runs first), so a step
    with prefix passes has no merge launch (`merge` is None)."""

    def __init__(self, m: StepMeta, shape: ModelShape, dtype: torch.dtype, device: torch.device,
                 fold_merge: bool = False):
        s = m.shape
        n_q, n_kv, d = shape.n_q_heads, shape.n_kv_heads, shape.head_dim
        self.out = torch.empty((s.num_rows, n_q, d), dtype=dtype, device=device)
        self.write = KvWriteLaunch(s.num_rows, n_kv * d)
        self.extend = self.decode = None
        if s.ext_rows:
            self.extend = ExtendLaunch(n_q=n_q, n_kv=n_kv, d=d, qo_indptr=m.extend_indptr, prefix=m.extend_prefix,
                                       max_qo_len=s.ext_max_qo)
            self.ext_lse = torch.empty((s.ext_rows, n_q), dtype=torch.float32, device=device)
        if s.dec_rows:
            self.decode = decode_launch(rows=s.dec_rows, n_q=n_q, n_kv=n_kv, d=d, kv=m.decode_kv,
                                        max_kv_len=s.dec_max_kv, mean_kv_len=s.dec_mean_kv, device=device)
            self.dec_lse = torch.empty((s.dec_rows, n_q), dtype=torch.float32, device=device)
        self.passes: list[PassLaunch] = []
        if not s.passes:
            return
        g = s.grouped_rows
        if not fold_merge:  # the prefix half apart, for the merge
            self.pre_o = torch.empty((g, n_q, d), dtype=dtype, device=device)
            self.pre_lse = torch.empty((g, n_q), dtype=torch.float32, device=device)
        self.suf_o = torch.empty((g, n_q, d), dtype=dtype, device=device)
        self.suf_lse = torch.empty((g, n_q), dtype=torch.float32, device=device)
        self.merged_lse = torch.empty((g, n_q), dtype=torch.float32, device=device)  # written, not read
        first = s.ext_rows + s.dec_rows
        for p in m.passes:
            ps = p.shape
            common = dict(rows=ps.rows, n_q=n_q, n_kv=n_kv, d=d, group_indptr=p.group_indptr, prefix=p.prefix,
                          max_group_size=ps.max_group, max_kv_len=ps.max_prefix, device=device, fold=fold_merge)
            launch = DenseLaunch(**common) if ps.path == "dense" else cascade_launch(**common,
                                                                                     mean_kv_len=ps.mean_prefix)
            self.passes.append(PassLaunch(p.row0 - first, p.row0 - first + ps.rows, launch))
        self.suffix = decode_launch(rows=g, n_q=n_q, n_kv=n_kv, d=d, kv=m.suffix_kv, max_kv_len=s.suffix_max_kv,
                                    mean_kv_len=s.suffix_mean_kv, device=device)
        self.merge = None if fold_merge else MergeLaunch(g * n_q, d)
