"""Leave one run out: each validation run judged by an engine calibration fitted on all the others.

    granisim validation loro A1 A2 B1 B2 C1 C2 --root RAW/validation --out reports/validation/loro

For every run X (ROOT/runX/h200_run: raw runs kept outside git, reports/README.md): `granisim validation report`
fits the engine coefficients on the other runs' steps pooled (`--fit-runs`, --profile-out
OUT/fit_without_X.json), then reports run X with that fit as it stands (`--check-profile`, OUT/runX/).
A run never enters the fit it is judged by, so across machines this is the out-of-sample error of a profile
fitted on all runs (the shipped `h200-engine`). OUT/loro.md holds the targets table (multi-agent / control /
Azure per cell, misses bold). No GPU needed.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

from granisim.validation.targets import profile_check_table
from granisim.config.files import OneLineParser

REPORT = [sys.executable, "-m", "granisim.validation.report"]


def _run_all(commands: list[list[str]]) -> None:
    """Run the commands two at a time (CI-sized machines); stop on the first failure with its output."""
    for i in range(0, len(commands), 2):
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for c in commands[i:i + 2]]
        for c, p in zip(commands[i:i + 2], procs):
            out, _ = p.communicate()
            if p.returncode:
                raise SystemExit(f"error: {' '.join(c[1:])} failed:\n{out}")


def table(out: Path, runs: list[str]) -> str:
    return profile_check_table(out, runs, ".", "fit on the others") + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation loro", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run names under ROOT without the 'run' prefix (e.g. A1 A2)")
    ap.add_argument("--root", type=Path, required=True, help="folder of raw runs ROOT/runX/h200_run")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        raise ValueError(f"runs: {' '.join(args.runs)}: leaving one run out needs at least two runs")
    data = {r: args.root / f"run{r}" / "h200_run" for r in args.runs}
    for r, d in data.items():
        if not d.is_dir():
            raise ValueError(f"{d}: no such run folder")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        fits = []
        for r in args.runs:
            first, *rest = [str(data[o]) for o in args.runs if o != r]
            fits.append(REPORT + [first, *(["--fit-runs", *rest] if rest else []), "--out", f"{scratch}/{r}",
                                  "--profile-out", str(args.out / f"fit_without_{r}.json")])
        _run_all(fits)
    _run_all([REPORT + [str(data[r]), "--out", str(args.out / f"run{r}"), "--check-profile",
                        str(args.out / f"fit_without_{r}.json")] for r in args.runs])
    text = table(args.out, args.runs)
    (args.out / "loro.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
