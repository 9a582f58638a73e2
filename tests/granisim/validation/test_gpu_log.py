"""The read-only GPU clock/power log (parser, sampler start/stop) and the sustained-load benchmark's CPU parts."""
import os
import sys
from datetime import datetime

import pytest

from granisim.validation.gpu_log import GpuLog, log_summary, nvidia_smi_command, read_gpu_log

LINES = [
    "2026/12/01 20:00:00.100, 250.50, 700.00, 1980, 2619, 41, 0x0000000000000000",
    "2026/12/01 20:00:00.200, 699.80, 700.00, 1710, 2619, 58, 0x0000000000000004",
    "2026/12/01 20:00:00.300, 698.10, 700.00, 1665, 2619, 60, 0x0000000000000004",
    "2026/12/01 20:00:00.400, [N/A], 700.00, 1700, 2619, 61, 0x0000000000000020",
    "2026/12/01 20:00:00.5",  # the sampler stopped mid-line
]


def test_the_log_parser_reads_samples_and_summarises_a_window(tmp_path):
    """Planted bug: the power-cap share read from any set throttle bit (``throttle > 0``) gives 3/4, not 2/4."""
    path = tmp_path / "gpu_log.csv"
    path.write_text("\n".join(LINES) + "\n")
    df = read_gpu_log(path)
    assert len(df) == 4  # the cut line dropped
    assert df.power_w.isna().sum() == 1 and df.sm_mhz.tolist() == [1980, 1710, 1665, 1700]
    assert df.throttle.tolist() == [0, 4, 4, 0x20]
    s = log_summary(df)
    assert s["samples"] == 4 and s["sm_mhz_p50"] == 1705 and s["power_limit_w"] == 700
    assert s["power_capped_share"] == 0.5 and s["hw_slowdown_share"] == 0.25 and s["temp_c_max"] == 61
    w = log_summary(df, datetime(2026, 12, 1, 20, 0, 0, 150000), datetime(2026, 12, 1, 20, 0, 0, 350000))
    assert w["samples"] == 2 and w["sm_mhz_p50"] == pytest.approx(1687.5)
    assert log_summary(df, datetime(2027, 1, 1)) == {"samples": 0}


def test_the_query_only_reads():
    cmd = nvidia_smi_command()
    assert cmd[0] == "nvidia-smi" and cmd[-2:] == ["-lms", "100"]
    assert all(a.startswith("--query-gpu=") or a.startswith("--format=") or a in ("-lms", "100") for a in cmd[1:])


def proc_lines(path):
    """Lines as the sampler writes them (blocks until each complete line is in the file)."""
    while not path.exists():
        os.sched_yield()
    with path.open() as f:
        buf = ""
        while True:
            buf += f.read()
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                yield line
            os.sched_yield()


def test_the_sampler_starts_and_stops(tmp_path):
    """A fake sampler (prints three sample lines, then waits for its stop signal): lines reach the file while
    the log is open; on exit the process is gone and nothing more is written."""
    fake = [sys.executable, "-c",
            "import signal\nfor _ in range(3):\n print('" + LINES[0] + "', flush=True)\nsignal.pause()"]
    path = tmp_path / "gpu_log.csv"
    with GpuLog(path, command=fake) as log:
        proc = log.proc
        assert proc is not None and proc.poll() is None
        for line_count, _ in enumerate(iter(proc_lines(path)), 1):  # three samples reach the file
            if line_count >= 3:
                break
    assert log.proc is None and proc.poll() is not None
    size = path.stat().st_size
    proc.wait()  # the sampler has exited: nothing can write to the file any more
    assert path.stat().st_size == size
    assert len(read_gpu_log(path)) >= 3


def test_a_missing_sampler_is_a_note_not_an_error(tmp_path, capsys):
    with GpuLog(tmp_path / "gpu_log.csv", command=["no-such-nvidia-smi-here"]) as log:
        pass
    assert "not found" in log.note and "not found" in capsys.readouterr().err
    assert not (tmp_path / "gpu_log.csv").exists()
    with GpuLog(tmp_path / "off.csv", enabled=False, command=["no-such"]) as off:
        assert off.proc is None and off.note == ""


def test_sustained_load_arguments_and_table():
    pytest.importorskip("torch")  # the gpu_backend package imports torch
    from gpu_backend.bench.sustained_load import markdown, parse_args, table_rows

    a = parse_args(["--out", "x", "--load-s", "30", "--probe-every-s", "3"])
    assert (a.idle_s, a.load_s, a.probe_every_s, a.no_log) == (20.0, 30.0, 3.0, False)
    s = parse_args(["--out", "x", "--smoke"])
    assert s.load_s <= 2 and s.idle_s <= 0.5
    for bad in (["--load-s", "0"], ["--probe-every-s", "90"], ["--idle-s", "-1"]):
        with pytest.raises(SystemExit) as err:
            parse_args(["--out", "x", *bad])
        assert err.value.code == 2
    probes = [{"phase": "cold", "t_s": 0.0, "us": {"g": 100.0}},
              *({"phase": "load", "t_s": float(t), "us": {"g": 100.0 + t}} for t in (5, 10, 15, 20)),
              {"phase": "recovered", "t_s": 0.0, "us": {"g": 101.0}}]
    (row,) = table_rows(probes)
    assert row["cold_us"] == 100 and row["load_us"] == 115 and row["load_vs_cold"] == pytest.approx(0.15)
    assert row["recovered_us"] == 101  # the load median is over the last half of the load (t >= 10 s)
    text = markdown({"table": [row], "clocks": {}, "log_note": "nvidia-smi not found"})
    assert "+15.0%" in text and "No clock log" in text
