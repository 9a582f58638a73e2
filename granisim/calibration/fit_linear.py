"""Linear operators and host time: the roofline fit per GEMM / element-wise family, the measured
table the measured profile uses, host-bound rows (the GPU waited for the host), and the per-step
overhead of a CUDA-graph replay.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from granisim.costmodel import GEMM_FAMILIES, fit_roofline, op_work, roofline_time
from granisim.config.models import ModelShape

from .fitting import folds_of, rel_err, summary
from .raw import Raw

TABLE_COLS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
              "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


HOST_BOUND_FACTOR = 1.6
CENSORED_LAUNCH_CAP = 3e-6  # an element-wise kernel's fixed time in a graph is ~1-2 us (KV write at T = 1)


def host_floor(raw: Raw) -> float:
    """The host's time to issue one graph replay in the timing loop: the shortest replay of the run
    (linear and attention rows; a replay can never be shorter)."""
    reps = [df["k"].to_numpy(float) * df["median_us"].to_numpy(float)
            for df in (raw.linear, raw.attention) if "k" in df.columns and len(df)]
    return float(np.min(np.concatenate(reps))) if reps else 0.0


def host_bound(df: pd.DataFrame, floor: float) -> np.ndarray:
    """Rows whose CUDA-graph replay (k calls) was not clearly longer than the host's time to issue
    one (``floor``): the GPU waited for the host, so the sample is the host's loop time, not the
    kernels' (the H200 run: element-wise torch ops below ~1.5K tokens, ~13.5 us whatever the size)."""
    if "k" not in df.columns or floor <= 0:
        return np.zeros(len(df), bool)
    return df["k"].to_numpy(float) * df["median_us"].to_numpy(float) < HOST_BOUND_FACTOR * floor


def vidur_table(lin: pd.DataFrame) -> pd.DataFrame:
    """The linear rows as a Vidur-format table (ms medians by num_tokens; the post-attention norm is
    the same operator as the input norm). Host-bound rows (``censored``) carry the roofline's time."""
    lin = lin.copy()
    if "censored" in lin.columns and "pred_s" in lin.columns:
        lin.loc[lin["censored"], "median_us"] = lin.loc[lin["censored"], "pred_s"] * 1e6
    piv = lin.pivot_table(index="n", columns="op", values="median_us", aggfunc="median") * 1e-3
    piv["post_attention_layernorm"] = piv.get("input_layernorm")
    keep = [c for c in TABLE_COLS if c in piv.columns]
    piv = piv[keep].dropna()
    out = pd.DataFrame({"num_tokens": piv.index.astype(int), "num_tensor_parallel_workers": 1})
    for c in keep:
        out[f"time_stats.{c}.median"] = piv[c].to_numpy()
    return out.reset_index(drop=True)


def table_interp(n, ns, ts):
    """The cost model's reading of a linear table: linear in n inside, proportional to n outside."""
    out = np.interp(n, ns, ts)
    out = np.where(n > ns[-1], ts[-1] * n / ns[-1], out)
    return np.where(n < ns[0], ts[0] * n / ns[0], out)


def fit_linear(raw: Raw, values: dict, model: ModelShape, seed: int = 0, folds: int = 5,
               max_launch_s: float = 2e-5):
    """Roofline per linear family (train rows) and the held-out errors of both the roofline and the
    measured table interpolated (linearly in n, as the cost model does) from the train rows."""
    lin = raw.linear.copy().reset_index(drop=True)
    lin["censored"] = host_bound(lin, host_floor(raw))
    fold = folds_of(lin, folds, seed + 1)
    fold[lin["censored"].to_numpy()] = -2  # never fitted on, never scored
    lin["heldout"] = fold >= 0
    P, BW = values["bf16_flops"], values["hbm_bandwidth"]
    lin["meas_s"] = lin["median_us"] * 1e-6
    lin["pred_s"] = np.nan
    lin["table_s"] = np.nan
    errors = {}
    for fam, g in lin.groupby("family"):
        gf = fold[g.index]
        fa, ba = op_work(fam, g["n"].to_numpy(float), model)
        cap = max_launch_s if not g["censored"].any() else CENSORED_LAUNCH_CAP
        for k in [*sorted(set(gf[gf >= 0])), None]:  # each fold held out in turn, then all rows
            tr = g[(gf != k) & (gf != -2)] if k is not None else g[gf != -2]
            f, by = op_work(fam, tr["n"].to_numpy(float), model)
            launch, ef, em = fit_roofline(f, by, tr["meas_s"].to_numpy(), P, BW, max_launch_s=cap)
            pred = roofline_time(fa, ba, P, BW, launch, ef if fam in GEMM_FAMILIES else 1.0, em)
            trs = tr.sort_values("n")
            tab = table_interp(g["n"].to_numpy(float), trs["n"].to_numpy(float), trs["meas_s"].to_numpy(float))
            sel = (gf == k) if k is not None else (gf == -1)
            lin.loc[g.index[sel], "pred_s"] = pred[sel]
            lin.loc[g.index[sel], "table_s"] = tab[sel]
        values[f"linear.{fam}.launch_s"] = launch
        if fam in GEMM_FAMILIES:
            values[f"linear.{fam}.flop_eff"] = ef
        values[f"linear.{fam}.mem_eff"] = min(em, 1.0)
        cen = gf == -2
        lin.loc[g.index[cen], "pred_s"] = pred[cen]   # the final roofline stands in for host-bound rows
        lin.loc[g.index[cen], "table_s"] = pred[cen]
        h = lin.loc[g.index][g.heldout.to_numpy()]
        errors[f"linear.{fam}"] = {"heldout": summary(rel_err(h.pred_s, h.meas_s))}
        errors[f"table.{fam}"] = {"heldout": summary(rel_err(h.table_s, h.meas_s))}
    h = lin[lin.heldout & (lin.family != "lm_head")]
    errors["linear(table)"] = {"heldout": summary(rel_err(h.table_s, h.meas_s))}
    errors["linear(roofline)"] = {"heldout": summary(rel_err(h.pred_s, h.meas_s))}
    return values, lin, errors


def step_overhead(raw: Raw) -> tuple[float, str]:
    """Host time of one step when its launches are a CUDA-graph replay: replay wall clock - replay
    device time, plus building a 64-request step's attention metadata."""
    o = raw.overhead.set_index("what")
    med = o["median_us"]
    if "graph_step_wall" not in med or "graph_step_events" not in med:
        raise ValueError("overhead.csv lacks graph_step_wall / graph_step_events")
    graph = max(0.0, float(med["graph_step_wall"]) - float(med["graph_step_events"]))
    meta = o[o.index == "metadata_host"]
    md = float(meta[meta["B"] == 64]["median_us"].iloc[0]) if len(meta[meta["B"] == 64]) else 0.0
    how = (f"graph replay wall {float(med['graph_step_wall']):.0f} us - device {float(med['graph_step_events']):.0f} us"
           f" = {graph:.0f} us, + metadata of 64 requests {md:.0f} us")
    if "eager_step_wall" in med:
        how += f"; for reference the same step launched eagerly took {float(med['eager_step_wall']):.0f} us wall"
    return (graph + md) * 1e-6, how
