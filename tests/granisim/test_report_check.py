"""reports/check_current.py: a committed report file differs from a re-run only where a figure does."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_current", ROOT / "reports" / "check_current.py")
check_current = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_current)


def test_a_changed_figure_is_found_and_a_runs_own_fields_are_not():
    committed = {"commit": "abc", "date": "d1", "wall_s": 3.0, "rows": [{"rate": 1.25, "n": 3}, {"rate": 2.0}]}
    rerun = {"commit": "def", "date": "d2", "wall_s": 9.0, "rows": [{"rate": 1.25 * (1 + 1e-12), "n": 3},
                                                                     {"rate": 2.0}]}
    assert check_current.differences(rerun, committed) == []
    rerun["rows"][1]["rate"] = 2.0001  # catches: a figure that moved in the fifth digit passing as equal
    assert check_current.differences(rerun, committed) == ["/rows[1]/rate: 2.0001, committed 2.0"]
    rerun["rows"].append({})
    assert check_current.differences(rerun, committed) == ["/rows: 3 items, committed 2"]
    assert check_current.differences({"a": 1}, {"a": 1, "b": 2}) == ["/b: only in the committed file"]
    assert check_current.differences({"n": 3}, {"n": 4}) == ["/n: 3, committed 4"]


def test_every_committed_file_it_checks_exists():
    for runs in check_current.PARTS.values():
        for _, files in runs:
            for _, committed in files:
                assert (ROOT / committed).is_file(), committed


def test_text_files_are_compared_line_by_line(tmp_path):
    new, old = tmp_path / "new.txt", tmp_path / "old.txt"
    old.write_text("a\nb\n")
    new.write_text("a\nc\n")
    assert check_current.compare(new, old) == ["line 2: 'c', committed 'b'"]
    new.write_text("a\nb\n")
    assert check_current.compare(new, old) == []
    assert check_current.compare(tmp_path / "missing.txt", old) == [f"{tmp_path / 'missing.txt'} was not written"]


def test_csv_files_are_compared_by_value_without_wall_times(tmp_path):
    new, old = tmp_path / "new.csv", tmp_path / "old.csv"
    old.write_text("point_id,throughput_rps,sim_wall_s\na,1.5,3.2\n")
    new.write_text("point_id,throughput_rps,sim_wall_s\na,1.50,9.9\n")
    assert check_current.compare(new, old) == []
    new.write_text("point_id,throughput_rps,sim_wall_s\na,1.6,3.2\n")  # catches: a moved figure in a sweep table
    assert check_current.compare(new, old) == ["[0]/throughput_rps: 1.6, committed 1.5"]
