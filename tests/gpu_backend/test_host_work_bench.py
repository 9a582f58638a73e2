"""The host-work benchmarks' pure parts (no timing asserted): the CPU table's JSON, and the engine benchmark's
earlier-commit loader."""
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gpu_backend.bench import engine_host, host_work  # noqa: E402
from gpu_backend.executor import executor, rows  # noqa: E402

EXECUTOR = Path(executor.__file__).parent


def test_host_work_writes_one_row_per_policy(tmp_path):
    host_work.main(["--out", str(tmp_path), "--policies", "granikv", "--lp", "512", "--k", "2", "--requests", "6",
                    "--plans", "2", "--number", "1", "--repeat", "1"])
    out = json.loads((tmp_path / "host_work.json").read_text())
    (row,) = out["rows"]
    assert row["policy"] == "granikv" and row["batch"] == 6 and 1 <= row["plans"] <= 2
    assert row["build_us"]["n"] == row["build_reference_us"]["n"] == row["plans"]


def test_the_earlier_executor_runs_on_its_own_host_path(tmp_path):
    """`load_before` wires the loaded executor to the loaded rows/arena/metadata, not to the package's: a loaded
    rows.build that is a different function object from the package's, and the package's own left alone."""
    for name in engine_host.NAMES:
        shutil.copy(EXECUTOR / f"{name}.py", tmp_path / f"{name}.py")
    before = engine_host.load_before(tmp_path)
    assert before.rows is not rows and before.rows.build is not rows.build
    assert before.MetaArena.__module__ == "gpu_backend.executor._before_arena"
    assert before.metadata.__name__ == "gpu_backend.executor._before_metadata"
    assert executor.rows is rows  # the package's executor still builds with the package's rows


def test_the_listed_ids_host_path_is_this_code_without_the_request_table(tmp_path):
    """`--before listed`: no folder of earlier files; the before units run this executor with the request table off
    (every decode id listed each step), the after units with it on (CPU smoke run: tiny model, interpreter)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU smoke run needs TRITON_INTERPRET=1")
    engine_host.main(["--before", "listed", "--out", str(tmp_path), "--smoke", "--reps", "1", "--lp", "64", "--k", "2",
                      "--requests", "4", "--policies", "token"])
    units = json.loads((tmp_path / "engine_host.json").read_text())["units"]
    tables = {u["variant"]: u["executor"]["request_table"] for u in units}
    assert tables == {"before": False, "after": True}


def test_executor_options_are_read_as_python_literals_and_bad_ones_exit_2(capsys):
    """`--before-option` / `--after-option NAME=VALUE`: the value a Python literal where it is one, else the text; a
    malformed option is one line and exit 2 before anything runs."""
    assert engine_host._option("small_in_graph=True") == ("small_in_graph", True)
    assert engine_host._option("graph_max_rows=512") == ("graph_max_rows", 512)
    assert engine_host._option("device=cuda") == ("device", "cuda")
    with pytest.raises(SystemExit) as e:
        engine_host.main(["--before", "current", "--after-option", "small_in_graph"])
    assert e.value.code == 2
    assert "expected NAME=VALUE, got 'small_in_graph'" in capsys.readouterr().err
