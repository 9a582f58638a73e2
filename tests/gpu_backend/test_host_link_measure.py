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
    # pages into one run of host slots are one copy; pages into scattered runs of 16 are one copy each
    for r in rows:
        assert int(r["pieces"]) == (1 if int(r["host_run"]) == int(r["tokens"]) else -(-int(r["tokens"]) // 16))


def test_fit_recovers_a_known_link():
    bw, launch, piece, to_gpu, to_host = 50e9, 8e-6, 1.5e-6, 4e9, 16e9
    rows = [dict(kind="slab", bytes=b, pieces=1, median_us=(launch + b / bw) * 1e6) for b in (1e8, 5e8, 2e9)]
    rows += [dict(kind="pages", direction=d, bytes=b, pieces=n, median_us=(n * piece + b / pbw) * 1e6)
             for d, pbw in (("to_gpu", to_gpu), ("to_host", to_host)) for b, n in ((1e8, 800), (2e9, 16384), (5e8, 31))]
    got = fit(rows)
    assert abs(got["host.link_bandwidth"] / bw - 1) < 1e-6
    assert abs(got["host.copy_launch_s"] - launch) < 1e-9
    assert abs(got["host.page_copy_s"] / piece - 1) < 1e-4
    assert abs(got["host.page_bandwidth_to_gpu"] / to_gpu - 1) < 1e-4
    assert abs(got["host.page_bandwidth_to_host"] / to_host - 1) < 1e-4
