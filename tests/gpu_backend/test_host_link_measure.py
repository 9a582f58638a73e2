"""calibration/measure/host_link.py: the section runs on the CPU and its fit recovers a known link."""

import csv

from calibration.measure.host_link import fit, main


def test_smoke_on_cpu(tmp_path):
    assert main(["--out", str(tmp_path), "--smoke"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "host_link.csv")))
    kinds = {(r["kind"], r["page"], r["direction"]) for r in rows}
    assert kinds == {(k, p, d) for k, p in (("slab", "0"), ("pages", "1"), ("pages", "16"))
                     for d in ("to_host", "to_gpu")}
    assert all(float(r["gb_per_s"]) > 0 for r in rows)


def test_fit_recovers_a_known_link():
    bw, launch, piece = 50e9, 8e-6, 1.5e-6
    rows = [dict(kind="slab", bytes=b, pieces=1, median_us=(launch + b / bw) * 1e6) for b in (1e8, 5e8, 2e9)]
    rows += [dict(kind="pages", bytes=b, pieces=n, median_us=(n * piece + b / bw) * 1e6)
             for b, n in ((1e8, 800), (2e9, 16384))]
    got = fit(rows)
    assert abs(got["host.link_bandwidth"] / bw - 1) < 1e-6
    assert abs(got["host.copy_launch_s"] - launch) < 1e-9
    assert abs(got["host.page_copy_s"] - piece) < 1e-9
