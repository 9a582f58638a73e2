"""How much host work does the current engine's metadata build save on the validation runs' own steps?

    python reports/validation/host_build/build_times.py RAW/validation/runT1 --before BEFORE \
        --out reports/validation/host_build/build_times.json

The validation runs were measured with the engine's host path as it was before the one-pass metadata build
(commit f43a61a; BEFORE holds that version of ``gpu_backend/executor/rows.py``: ``git show
af25887:gpu_backend/executor/rows.py > BEFORE/rows.py``). For every unit of the given run folders this serves
the unit's scenario again on the CPU with each step lasting what it measured (the measured schedule, as
``granisim validation rebuild-plans`` does, here with the allocator's slot layouts kept), and times
``rows.build`` of every step with both versions (best of three, on this machine's CPU). Prints per unit the
median per decode step of: the step's measured host part on the GPU machine (``measured_overhead``), its
price (``h200-engine``), and the two build times here. CPU only; writes JSON.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import pandas as pd

from gpu_backend.executor import rows as rows_now
from gpu_backend.executor.executor import GRAPH_MAX_ROWS  # steps up to it are padded for graph replay
from granisim.core.serving_loop import ServingLoop
from granisim.experiments.run import prepare
from granisim.validation.clock_term import units_folder
from granisim.validation.gpu_runs import split_unit, validation_scenario
from granisim.validation.plans import MeasuredReplay
from granisim.validation.validate import PairedExecutor


def load_rows(path: Path):
    """The ``rows`` module at ``path`` (another version of gpu_backend/executor/rows.py)."""
    spec = importlib.util.spec_from_file_location("rows_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def best_of(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


class _Timed(MeasuredReplay):
    """The measured schedule replayed with slot layouts; each plan's build timed with both versions."""

    needs_layouts = True

    def __init__(self, steps: pd.DataFrame, where: str, num_slots: int, versions: dict):
        super().__init__(steps, where)
        self.num_slots, self.versions, self.times = num_slots, versions, []

    def execute(self, plan):
        pad = plan.num_tokens <= GRAPH_MAX_ROWS
        self.times.append({k: best_of(lambda: m.build(plan, self.num_slots, pad=pad))
                           for k, m in self.versions.items()})
        return super().execute(plan)


def unit_times(folder: Path, versions: dict) -> dict | None:
    """Median per decode step (ms) of the measured and priced host part and of each version's build."""
    parsed = split_unit(folder.name)
    if parsed is None or not (folder / "steps.parquet").exists():
        return None
    workload, policy, model = parsed
    steps = pd.read_parquet(folder / "steps.parquet")
    setup = prepare(validation_scenario(workload, None, "h200-engine", policy, model))
    timed = _Timed(steps, str(folder), setup.kv_budget, versions)
    paired = PairedExecutor(timed, setup.profile, setup.model, idle=False)  # prices each step with h200-engine
    ServingLoop(setup, paired, progress=False).run()
    if timed.i != len(steps):
        raise ValueError(f"{folder}: the replay ran {timed.i} steps, the unit measured {len(steps)}")
    built = pd.DataFrame(timed.times, index=steps.index)
    dec = ~steps.prefill.to_numpy(bool)
    priced = pd.Series([r["predicted_overhead"] for r in paired.rows], index=steps.index)
    out = {"decode_steps": int(dec.sum()),
           "measured_host_ms": float(steps.measured_overhead[dec].median() * 1e3),
           "priced_host_ms": float(priced[dec].median() * 1e3)}
    for k in versions:
        out[f"build_{k}_ms"] = float(built[k][dec].median() * 1e3)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run folders (each holding h200_run/ or the units)")
    ap.add_argument("--before", type=Path, required=True, help="a folder holding the earlier rows.py")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if not (a.before / "rows.py").exists():
        ap.exit(2, f"{a.before / 'rows.py'}: no such file (git show af25887:gpu_backend/executor/rows.py)\n")
    versions = {"before": load_rows(a.before / "rows.py"), "now": rows_now}
    doc = {"units": {}}
    print("| run | unit | decode steps | host part measured, ms | priced | build before, ms (here) | build now |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for run in a.runs:
        for folder in sorted(p for p in units_folder(run).iterdir() if p.is_dir()):
            u = unit_times(folder, versions)
            if u is None:
                continue
            doc["units"][f"{run.name}/{folder.name}"] = u
            print(f"| {run.name} | {folder.name} | {u['decode_steps']} | {u['measured_host_ms']:.3f} | "
                  f"{u['priced_host_ms']:.3f} | {u['build_before_ms']:.3f} | {u['build_now_ms']:.3f} |", flush=True)
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
