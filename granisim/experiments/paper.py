"""The paper's claims in simulation (``granisim paper``): ``reports/paper/``.

For each hardware profile, one sweep (the :mod:`granisim.experiments.sweep` machinery: parallel,
resumable) runs every point the claims need; the table puts the paper's figure beside
ours and, for each ratio, the cost-model terms (``t_*`` totals of ``steps.parquet``,
summed over the run) that moved most between the two policies. Then the beyond-the-paper
sweeps in ``sweeps/`` (adaptive HOT, dispatch, M_sat, tenancy) run on the first profile
and are summarised with their plots.

Throughput is measured at saturation: every point's requests arrive within a few seconds
(``workload.rate`` far above what the engine serves), so completed requests / makespan is
the engine's maximum. The paper's own figures are quoted from arXiv 2608.15584; nothing
of ours is typed in — every number below is read from the results tables this command
writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.config.hardware import get_profile
from granisim.experiments.paper_claims import BEYOND, PAPER, Results, claims, claims_spec
from granisim.experiments.sweep import PointsFailed, failure_lines, run_sweep
from granisim.experiments.sweep_file import sweep_from_dict
from granisim.config.files import one_line, out_folder
from granisim.experiments.compare import parse_names

def _coeffs(profile: str) -> str:
    p = get_profile(profile)
    keys = ("m_sat", "storage.page1_eff", "storage.page16_eff", "storage.slab_eff", "attn.decode.mem_eff",
            "attn.cascade.mem_eff", "attn.dense.flop_eff", "overhead.step_s")
    out = []
    for k in keys:
        c = p.coefficients.get(k)
        if c is not None:
            out.append(f"`{k}` = {c.value:g} ({c.source.kind})")
    return ", ".join(out)


def _claims_table(rows: list[dict]) -> str:
    return _md_table(["claim", "paper", "ours", "detail", "terms that moved most (baseline → target, s over the run)",
                      "reading (from the same rows)"],
                     ([x["claim"], str(x["paper"]), f"**{x['ours']:.2f}x**", x["extra"], x["terms"], x.get("reading", "")]
                      for x in rows)).rstrip("\n")


def _plot(rows: list[dict], path: Path, title: str) -> None:
    from granisim.experiments.plots import plt, save_figure  # report sets the Agg backend

    import textwrap

    rs = [x for x in rows if x["paper_value"] is not None]
    labels = [textwrap.fill(x["claim"], 48, max_lines=4, placeholder=" ...") for x in rs]
    lines = max((lb.count("\n") + 1 for lb in labels), default=1)
    fig, ax = plt.subplots(figsize=(15, 1.0 + len(rs) * max(0.55, 0.19 * lines + 0.2)))
    y = np.arange(len(rs))
    pb = ax.barh(y - 0.2, [x["paper_value"] for x in rs], 0.4, label="paper (arXiv 2608.15584)")
    ob = ax.barh(y + 0.2, [x["ours"] for x in rs], 0.4, label="granisim")
    for bars in (pb, ob):
        ax.bar_label(bars, fmt="%.2fx", padding=2, fontsize=8)
    ax.set_yticks(y, labels, fontsize=9)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("throughput ratio (x)")
    ax.set_xlim(0, 1.12 * max([x["paper_value"] for x in rs] + [x["ours"] for x in rs] + [1.0]))
    ax.invert_yaxis()
    ax.legend(loc="upper right")
    ax.set_title(title)
    save_figure(fig, path)


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _beyond(name: str, df: pd.DataFrame, spec) -> dict:
    """Summaries of the beyond-the-paper sweeps, computed from their tables."""
    from granisim.experiments.sweep_plots import add_speedup

    if name == "adaptive_hot":
        sp = add_speedup(df, spec.speedup, spec.varied)
        out, worst = [], 0.0
        for (k, lp), g in sp.groupby(["workload.roles", "workload.prefix_len"]):
            static = g[g["policy.hot_fraction"].astype(str) != "adaptive"]
            best = static.loc[static.throughput_rps.idxmax()]
            ad = g[g["policy.hot_fraction"].astype(str) == "adaptive"].iloc[0]
            rel = ad.throughput_rps / best.throughput_rps
            worst = min(worst, rel - 1)
            out.append({"k": int(k), "L_p": int(lp), "best_static": best["policy.hot_fraction"],
                        "best_static_speedup": float(best.speedup), "adaptive_speedup": float(ad.speedup),
                        "adaptive_over_best": float(rel), "adaptive_hot_end": int(ad.hot_capacity_end)})
        wins = sum(x["adaptive_over_best"] >= 1 - 1e-9 for x in out)
        return {"points": out, "matches_or_beats": wins, "of": len(out), "worst_shortfall": max(0.0, -worst)}
    if name in ("dispatch", "dispatch_tenancy"):
        sp = add_speedup(df, spec.speedup, spec.varied)
        axes = ["workload.prefix_len", "scheduler.max_running" if name == "dispatch" else "workload.roles"]
        modes = [d for d in ("threshold", "cost", "auto", "cascade", "dense") if d in set(sp["policy.dispatch"])]
        out = []
        for (lp, b), g in sp.groupby(axes):
            v = {d: float(g[g["policy.dispatch"] == d].speedup.iloc[0]) for d in modes}
            best = max(v.values())
            out.append({"L_p": int(lp), "axis": int(b), "mean_batch": float(g.mean_batch.mean()), **v,
                        **{f"{d}_vs_best": v[d] / best for d in ("threshold", "cost", "auto")}})
        return {"axis": axes[1], "modes": modes, "points": out,
                "worst_vs_best": {d: min(x[f"{d}_vs_best"] for x in out) for d in ("threshold", "cost", "auto")},
                "min_speedup": {d: min(x[d] for x in out) for d in modes},
                "points_below_token": {d: sum(x[d] < 0.995 for x in out) for d in modes}}
    if name == "msat":
        out = []
        prof_msat = int(get_profile(spec.base.hardware.profile).m_sat)
        for lp, g in df.groupby("workload.prefix_len"):
            best = g.loc[g.throughput_rps.idxmax()]
            at = g.iloc[(g["policy.m_sat"] - prof_msat).abs().argsort().iloc[0]]
            out.append({"L_p": int(lp), "best_m_sat": int(best["policy.m_sat"]),
                        "best_rps": float(best.throughput_rps), "profile_m_sat": prof_msat,
                        "nearest_grid_m_sat": int(at["policy.m_sat"]), "profile_m_sat_rps": float(at.throughput_rps),
                        "loss_at_profile_m_sat": float(1 - at.throughput_rps / best.throughput_rps)})
        return {"points": out}
    if name == "tenancy":
        out = []
        for (k, p), g in df.groupby(["workload.roles", "policy.name"]):
            f = g[g["scheduler.admission"] == "fcfs"].iloc[0]
            q = g[g["scheduler.admission"] == "prefix"].iloc[0]
            out.append({"k": int(k), "policy": p, "fcfs_rps": float(f.throughput_rps),
                        "prefix_rps": float(q.throughput_rps), "fcfs_hit": float(f.prefix_hit_rate),
                        "prefix_hit": float(q.prefix_hit_rate)})
        return {"points": out}
    return {}


def _md_table(header: list[str], rows) -> str:
    """A markdown table: the header, its rule, one line per row (each a list of cells)."""
    head = "| " + " | ".join(header) + " |\n|" + " --- |" * len(header)
    return head + "\n" + "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n"


def _beyond_md(name: str, s: dict, folder: str) -> str:
    pts = s.get("points", [])
    if name == "adaptive_hot":
        table = _md_table(["k", "L_p", "best static", "its speedup", "adaptive", "adaptive / best",
                           "HOT tokens at end"],
                          [[f"{x['k']}", f"{x['L_p']}", f"{x['best_static']}", f"{x['best_static_speedup']:.3f}x",
                            f"{x['adaptive_speedup']:.3f}x", f"{x['adaptive_over_best']:.4f}",
                            f"{x['adaptive_hot_end']}"] for x in pts])
        return (f"**Adaptive HOT fraction** (`sweeps/adaptive_hot.toml`; table `{folder}/results.csv`, plot "
                f"`{folder}/*.png`): adaptive matches or beats the best static `hot_fraction` (0.05 … 0.6) at "
                f"**{s['matches_or_beats']} of {s['of']}** (k, L_p) points; worst shortfall "
                f"{s['worst_shortfall']:.2%}.\n\n" + table)
    if name in ("dispatch", "dispatch_tenancy"):
        modes = s["modes"]
        label = "max_running (mean batch)" if name == "dispatch" else "k (mean batch)"
        table = _md_table(["L_p", label, *modes],
                          [[f"{x['L_p']}", f"{x['axis']} ({x['mean_batch']:.0f})", *(f"{x[d]:.3f}" for d in modes)]
                           for x in pts])
        what = ("one role, group size set by max_running" if name == "dispatch" else
                "k roles, default batch limits: many small groups")
        return (f"**Dispatch: cost model vs the M_sat threshold, {what}** (`sweeps/{name}.toml`; `{folder}/`): "
                f"speedup over token. Worst / best mode per point: "
                + ", ".join(f"{d} {v:.4f}" for d, v in s["worst_vs_best"].items())
                + "; lowest speedup over token: " + ", ".join(f"{d} {v:.3f}x" for d, v in s["min_speedup"].items())
                + "; points below token (< 0.995x): " + ", ".join(f"{d} {v}" for d, v in
                                                                  s["points_below_token"].items())
                + ".\n\n" + table)
    if name == "msat":
        table = _md_table(["L_p", "best M_sat", "its req/s", "grid M_sat nearest the profile's", "its req/s", "loss"],
                          [[f"{x['L_p']}", f"{x['best_m_sat']}", f"{x['best_rps']:.3f}", f"{x['nearest_grid_m_sat']}",
                            f"{x['profile_m_sat_rps']:.3f}", f"{x['loss_at_profile_m_sat']:.2%}"] for x in pts])
        pm = pts[0]["profile_m_sat"] if pts else "?"
        return (f"**Throughput over M_sat** (`sweeps/msat.toml`, threshold dispatch, one role, batch ~600; "
                f"`{folder}/`; the profile's M_sat is {pm}):\n\n" + table)
    if name == "tenancy":
        table = _md_table(["k", "policy", "FCFS req/s", "prefix req/s", "gain", "hit rate"],
                          [[f"{x['k']}", f"{x['policy']}", f"{x['fcfs_rps']:.3f}", f"{x['prefix_rps']:.3f}",
                            f"{x['prefix_rps'] / x['fcfs_rps']:.2f}x", f"{x['fcfs_hit']:.2f} → {x['prefix_hit']:.2f}"]
                           for x in pts])
        return (f"**Tenancy-aware admission** (`sweeps/tenancy.toml`; `{folder}/`): `scheduler.admission = "
                f"\"prefix\"` vs FCFS.\n\n" + table)
    return ""


def _every_point(spec, out: Path, workers: int | None, ray: str | None) -> pd.DataFrame:
    """The sweep's results, every point of them (the tables read them all); PointsFailed if any point failed."""
    df = run_sweep(spec, out, workers=workers, ray_address=ray)
    if len(df) < len(spec.points):
        raise PointsFailed("\n".join(failure_lines(out, len(df), len(spec.points))))
    return df


def run_paper(out: Path, profiles: list[str], num_requests: int = 400, rate: float = 100.0,
              workers: int | None = None, ray: str | None = None, beyond: bool = True) -> dict:
    from granisim.experiments.sweep_plots import write_plots

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    report: dict = {"command": f"granisim paper --out {out} --profiles {','.join(profiles)} "
                               f"--num-requests {num_requests}",
                    "commit": _git("rev-parse", "--short", "HEAD"), "date": time.strftime("%Y-%m-%d"),
                    "paper": PAPER, "num_requests": num_requests, "rate": rate, "profiles": {}}
    md = ["# The paper's claims in simulation\n",
          f"Generated by `{report['command']}` at commit {report['commit']} on {report['date']}. Every "
          f"\"ours\" figure is read from the results tables written next to this file "
          f"(`<profile>/results.csv`, one row per simulated point with its full scenario in "
          f"`<profile>/results/`); the paper's figures are quoted from {PAPER}.\n",
          f"Method: each point simulates {num_requests} requests arriving at {rate:g} req/s (far above "
          f"capacity: throughput = completed / makespan is the engine's maximum), Azure-trace suffix and "
          f"output lengths, seed 0; default scheduler (max_running 256, 8192 tokens per step, retract "
          f"preemption) and memory (mem_fraction 0.9, 4 GB reserve). \"token\" is SGLang's default (page "
          f"size 1), \"paged16\" vLLM's. The last column lists the cost-model terms (`t_*` in steps.parquet, "
          f"summed over the run) that moved most between the baseline and the target: where our ratio "
          f"differs from the paper's, that term, and the profile coefficient behind it, is the reason.\n"]
    for prof in profiles:
        spec = claims_spec(prof, num_requests, rate)
        df = _every_point(spec, out / prof, workers, ray)
        df.drop(columns=["scenario"]).to_csv(out / prof / "results.csv", index=False)
        rows = claims(Results(spec, df))
        _plot(rows, out / f"{prof}.png", f"paper vs granisim on {prof}")
        kinds = [c.source.kind for c in get_profile(prof).coefficients.values()]
        measured = kinds.count("measured")
        status = (f"{kinds.count('published')} coefficients published (datasheets, papers, Vidur's A100 timings), "
                  f"{kinds.count('extrapolated')} extrapolated, {measured} measured by our calibration"
                  + (" — extrapolated today: these figures are predictions to check against the calibration run"
                     if measured == 0 else ""))
        report["profiles"][prof] = {"rows": rows, "measured_coefficients": measured, "points": len(spec.points)}
        md.append(f"## {prof}\n\nProfile `{prof}`: {status}. Key coefficients: {_coeffs(prof)}.\n\n"
                  + _claims_table(rows) + f"\n\n![{prof}]({prof}.png)\n")
    report["beyond"] = {}
    root = Path(__file__).resolve().parents[2] / "sweeps"
    for prof in (profiles if beyond else []):
        md.append(f"## Beyond the paper ({prof})\n")
        report["beyond"][prof] = {}
        for name in BEYOND:
            path = root / f"{name}.toml"
            raw = _raw(path)
            spec = sweep_from_dict({**raw, "set": {**raw.get("set", {}), "hardware.profile": prof}}, str(path), path)
            folder = out / "beyond" / prof / name
            df = _every_point(spec, folder, workers, ray)
            df.drop(columns=["scenario"]).to_csv(folder / "results.csv", index=False)
            write_plots(spec, df, folder)
            s = _beyond(name, df, spec)
            report["beyond"][prof][name] = s
            rel = folder.relative_to(out) if folder.is_relative_to(out) else folder
            md.append(_beyond_md(name, s, str(rel)))
            md.append("".join(f"![{p.name}]({rel}/{p.name})\n" for p in sorted(folder.glob("*.png"))) + "\n")
    report["wall_s"] = time.time() - t0
    (out / "paper.json").write_text(json.dumps(report, indent=2, default=_jsonable))
    (out / "README.md").write_text("\n".join(md))
    return report


def _raw(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    return str(x)


def paper_cli(args) -> int:
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    if not profiles:
        raise ValueError(f"--profiles {args.profiles!r}: give at least one profile, e.g. a100-80gb,h200")
    parse_names("--profiles", args.profiles, "a100-80gb,h200")  # one named twice would be reported twice
    for prof in profiles:  # every point of an unknown profile would fail, after the sweep has run
        try:
            get_profile(prof)
        except ValueError as err:
            raise ValueError(f"--profiles {prof!r}: {one_line(err, None)}") from None
    try:
        rep = run_paper(out_folder(args.out), profiles, num_requests=args.num_requests, workers=args.workers,
                        ray=args.ray)
    except PointsFailed as err:
        print(err, file=sys.stderr)
        return 1
    for prof, d in rep["profiles"].items():
        print(f"\n{prof}:")
        for x in d["rows"]:
            print(f"  {x['claim'][:95]:<95} paper {x['paper']:>22}  ours {x['ours']:.2f}x")
    print(f"\nwrote {args.out}/README.md, paper.json, plots ({rep['wall_s']:.0f} s)")
    return 0
