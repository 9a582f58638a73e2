"""The decode kernel's re-read share of a shared prefix on two GPUs, point by point.

    python reports/validation/current_engine/kernel_reread.py \\
        calibration/raw/h200_more/shared_decode_pool6m calibration/raw/h100/shared_decode \\
        --out reports/validation/current_engine/kernel_reread.json

Each folder is a ``python -m calibration.measure --only shared_decode`` run; the share per point is
granisim.calibration.reread's. Prints the medians by batch and overall, and the second GPU's share over the
first's on the points both measured (median, p10, p90), beside what keeping an L2 re-read's time per byte predicts
from the two shipped profiles (``granisim.calibration.carry.l2_ratio``). Needs no GPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from granisim.calibration.carry import l2_ratio
from granisim.calibration.reread import KEY, reread_share
from granisim.config.hardware import get_profile


def compare(first: Path, second: Path) -> dict:
    both = reread_share(first).merge(reread_share(second), on=KEY, suffixes=("_a", "_b")).dropna(subset=["f_a"])
    both["ratio"] = both.f_b / both.f_a

    def spread(x):
        return {"median": round(float(x.median()), 3), "p10": round(float(x.quantile(0.1)), 3),
                "p90": round(float(x.quantile(0.9)), 3)}

    return {"points": int(len(both)), "share_a": spread(both.f_a), "share_b": spread(both.f_b),
            "b_over_a": spread(both.ratio),
            "by_batch": {int(b): {"share_a": round(float(g.f_a.median()), 3), "share_b": round(float(g.f_b.median()), 3),
                                  "b_over_a": round(float(g.ratio.median()), 3)} for b, g in both.groupby("B")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("first", type=Path, help="shared_decode run of the first GPU (e.g. the H200's)")
    ap.add_argument("second", type=Path, help="shared_decode run of the second GPU")
    ap.add_argument("--profiles", nargs=2, default=["h200", "h100-sxm"], help="the two GPUs' profiles")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    doc = compare(args.first, args.second)
    doc["l2_ratio"] = round(l2_ratio(get_profile(args.profiles[0]), get_profile(args.profiles[1])), 4)
    doc["runs"] = [str(args.first), str(args.second)]
    print("| B | share, first | share, second | second / first |\n| ---: | ---: | ---: | ---: |")
    for b, r in doc["by_batch"].items():
        print(f"| {b} | {r['share_a']:.3f} | {r['share_b']:.3f} | {r['b_over_a']:.3f} |")
    a, b, r = doc["share_a"], doc["share_b"], doc["b_over_a"]
    print(f"{doc['points']} points: first {a['median']:.3f} ({a['p10']:.3f}-{a['p90']:.3f}), second {b['median']:.3f} "
          f"({b['p10']:.3f}-{b['p90']:.3f}); second / first {r['median']:.3f} (p10 {r['p10']:.3f}, p90 {r['p90']:.3f}); "
          f"an L2 re-read's time per byte kept predicts {doc['l2_ratio']:.3f}")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
