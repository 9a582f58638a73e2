"""`granisim validate` end to end on the CPU (tiny model, Triton interpreter): the pipeline
pairs every measured step with the cost model's price of the same plan and writes the report."""

import json

from granisim.cli import main


def test_validate_writes_a_report(tmp_path, capsys):
    sc = tmp_path / "tiny.toml"
    sc.write_text('name = "tiny"\n[model]\nname = "tiny"\n[hardware]\nkv_budget_tokens = 512\n'
                  "[workload]\nroles = 1\nprefix_len = 24\nnum_requests = 3\nrate = 100.0\n"
                  "suffix_scale = 0.01\nmax_output_len = 3\n")
    out = tmp_path / "val"
    assert main(["validate", str(sc), "--device", "cpu", "--out", str(out)]) == 0
    rep = json.loads((out / "validation.json").read_text())
    assert rep["steps"] >= 3
    assert rep["step_errors"]["total"]["n"] == rep["steps"]
    assert {"throughput_rps", "ttft_p99_s", "tpot_p50_s"} <= set(rep["end_to_end"])
    assert (out / "validation.png").exists() and (out / "steps.parquet").exists()
    assert "Per step" in capsys.readouterr().out
