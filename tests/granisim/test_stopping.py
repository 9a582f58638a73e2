"""A stop that lands where it is swallowed is not lost: the fuzzer reports it as a stop (never as a failure
with a reproduction), and a later signal still ends the process.

Shown to catch the bugs it guards: with the handler ignoring every signal after the first (as it once did), the
swallowed-stop process runs on and the second test fails on its hang guard; without the fuzzer's check of
:func:`stopping.requested`, ``granisim fuzz`` fuzzes to its end and the first test fails on exit code 0.
"""

import signal
import subprocess
import sys
import textwrap

from granisim.cli import main
from granisim.experiments import stopping


def test_fuzz_after_a_swallowed_stop_stops_and_writes_no_reproduction(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stopping, "_first", None)  # restored after the test
    monkeypatch.setattr(stopping, "install", lambda: setattr(stopping, "_first", (int(signal.SIGTERM), 0.0)))
    repro = tmp_path / "repro.py"
    rc = main(["fuzz", "--allocator", "token", "--examples", "5", "--seed", "1", "--repro", str(repro)])
    assert rc == 143
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("stopped by SIGTERM"), err
    assert "FUZZ FAILURE" not in err and not repro.exists()


def test_a_signal_after_a_swallowed_stop_ends_the_process():
    script = textwrap.dedent("""
        import os, signal
        from granisim.experiments import stopping
        stopping.install()
        stopping.UNWIND_S = 0.0
        try:
            signal.raise_signal(signal.SIGTERM)  # the handler runs before the next line
        except stopping.Stopped:
            pass  # swallowed, as a garbage-collector callback would
        assert stopping.requested().signum == signal.SIGTERM
        print("swallowed", flush=True)
        while True:
            signal.pause()  # until the next signal; a handler that ignores it comes back here
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "swallowed"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)  # a hang guard; nothing here is timed
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143
    assert proc.stderr.read().strip() == "stopped by SIGTERM: ended at once"
