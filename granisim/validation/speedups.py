"""Speedup table from a real-engine grid run (``granisim validation gpu-run speedup --out RUN``), no GPU needed.

    granisim validation speedups RAW/engine/speedup_2048 --out reports/engine/speedups

Writes OUT.json (every point: per-policy figures per repetition, granikv / baseline throughput
ratios per repetition) and OUT_table.md (the table quoted in reports/engine/README.md). A ratio is
taken within one repetition (the two units ran back to back in one process); the table shows
their mean and, with two or more repetitions, the range.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from granisim.config.files import OneLineParser, one_line

POLICIES = ("granikv", "token", "paged16")
UNIT = re.compile(r"speedup_lp(\d+)_k(\d+)_([a-z0-9-]+)(?:_rep(\d+))?\.json$")
AUTO = "granikv-auto"  # granikv with the cost-model dispatch that may skip a prefix pass (engine_h200 --policies)
KEEP = ("throughput_rps", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s", "decode_step_ms_p50",
        "decode_breakdown_ms_p50", "executor", "wall_s")


def load(run: Path) -> dict:
    """{(lp, k): {policy: {rep: unit figures}}}; a ValueError naming the folder or file where there are none
    or one is not a unit's JSON object."""
    if not run.is_dir():
        raise ValueError(f"{run}: no such run folder")
    points: dict = {}
    for f in sorted(run.glob("speedup_*.json")):
        m = UNIT.match(f.name)
        if not m:
            continue
        lp, k, pol, rep = int(m[1]), int(m[2]), m[3], int(m[4] or 0)
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{f}: not a readable speedup unit ({one_line(err, None)})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{f}: not a speedup unit (a JSON {type(d).__name__}, not an object)")
        points.setdefault((lp, k), {}).setdefault(pol, {})[rep] = {key: d.get(key) for key in KEEP}
    if not points:
        raise ValueError(f"{run}: no speedup_*.json units (granisim validation gpu-run speedup --out {run})")
    return points


def ratios(units: dict, base: str, pol: str = "granikv") -> list[float]:
    """pol / base throughput within each repetition that has both units."""
    g, b = units.get(pol, {}), units.get(base, {})
    return [g[r]["throughput_rps"] / b[r]["throughput_rps"] for r in sorted(g) if r in b]


def _fmt(rs: list[float]) -> str:
    if not rs:
        return "-"
    mean = sum(rs) / len(rs)
    return f"{mean:.2f}x" + (f" ({min(rs):.2f}-{max(rs):.2f}, n={len(rs)})" if len(rs) > 1 else " (n=1)")


def table(points: dict) -> str:
    auto = any(AUTO in units for units in points.values())
    head = ("| L_p | k | req/s granikv / token / paged16 (rep 0) | granikv / token | granikv / paged16 | "
            "TPOT p50 ms (rep 0) | TTFT p99 s (rep 0) | decode step p50 ms granikv / token (rep 0) |"
            + (f" {AUTO} / token |" if auto else ""))
    lines = [head, "|" + "---|" * (9 if auto else 8)]
    for (lp, k), units in sorted(points.items()):
        r0 = {p: units[p][0] for p in POLICIES if 0 in units.get(p, {})}
        cell = lambda key, scale, fmt: " / ".join(fmt.format(r0[p][key] * scale) if p in r0 else "-" for p in POLICIES)  # noqa: E731
        dec = " / ".join(f"{r0[p]['decode_step_ms_p50']:.1f}" if p in r0 else "-" for p in ("granikv", "token"))
        lines.append(f"| {lp} | {k} | {cell('throughput_rps', 1, '{:.2f}')} | {_fmt(ratios(units, 'token'))} | "
                     f"{_fmt(ratios(units, 'paged16'))} | {cell('tpot_p50_s', 1e3, '{:.1f}')} | "
                     f"{cell('ttft_p99_s', 1, '{:.2f}')} | {dec} |"
                     + (f" {_fmt(ratios(units, 'token', AUTO))} |" if auto else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="granisim validation speedups", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="path prefix: writes PREFIX.json and PREFIX_table.md")
    args = ap.parse_args(argv)
    points = load(args.run)
    doc = {"run": str(args.run), "commit": (args.run / "commit.txt").read_text().strip()
           if (args.run / "commit.txt").exists() else "?",
           "points": [{"lp": lp, "k": k, "units": units,
                       "granikv_over_token": ratios(units, "token"), "granikv_over_paged16": ratios(units, "paged16"),
                       **({f"{AUTO}_over_token": ratios(units, "token", AUTO)} if AUTO in units else {})}
                      for (lp, k), units in sorted(points.items())]}
    all_r = [r for p in doc["points"] for r in p["granikv_over_token"] + p["granikv_over_paged16"]]
    doc["lowest_ratio"] = min(all_r) if all_r else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(doc, indent=1) + "\n")
    Path(f"{args.out}_table.md").write_text(table(points))
    print(table(points))


if __name__ == "__main__":
    main()
