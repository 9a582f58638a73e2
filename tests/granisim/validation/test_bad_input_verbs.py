"""Bad input to the `granisim validation` verbs through the real CLI: exit 2 and exactly one stderr line
naming the file (or the argument) and what is wrong; never a traceback, never exit 0 on nothing read or
exit 1 for a user's mistake. Each case is a folder or file a user could hand the verb."""

import pickle

import pytest

from granisim.cli import main
from tests.granisim.cli_errors import one_line_error

UNIT = "control_short_granikv_llama-3.1-8b"


def _one_line_error(capsys, argv: list[str], *needles: str) -> str:
    try:
        rc = main(argv)
    except SystemExit as stop:  # verbs that stop with SystemExit(2) themselves (summary, fleet-summary)
        rc = stop.code
    return one_line_error(capsys, rc, *needles)


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# (files to write under tmp_path: relative path -> text, argv with T for tmp_path, what the line names)
CASES = {
    "speedups: no units (was exit 1)": ({"run/x.txt": ""}, ["speedups", "T/run", "--out", "T/o"],
                                        ["T/run", "no speedup_*.json units"]),
    "speedups: unit not an object": ({"run/speedup_lp1_k2_granikv.json": "[1]"},
                                     ["speedups", "T/run", "--out", "T/o"],
                                     ["T/run/speedup_lp1_k2_granikv.json", "not a speedup unit"]),
    "engine-vs-sim: no such run (was exit 0)": ({}, ["engine-vs-sim", "T/none", "--out", "T/o"],
                                                ["T/none", "no such run folder"]),
    "runs: no such root (was exit 0)": ({}, ["runs", "T/none", "--out", "T/o"], ["T/none", "no such folder"]),
    "runs: no validation units (was exit 0)": ({"root/x.txt": ""}, ["runs", "T/root", "--out", "T/o"],
                                               ["T/root", "no validation_*.json"]),
    "runs: unit JSON not an object": ({f"root/runA/validation_{UNIT}.json": "[1]"},
                                      ["runs", "T/root", "--out", "T/o", "--requests", "5"],
                                      [f"T/root/runA/validation_{UNIT}.json", "end_to_end"]),
    "replay: no such run (was exit 0)": ({}, ["replay", "T/none"], ["T/none", "no such run folder"]),
    "replay: no unit in the run (was exit 0)": ({"run/h200_run/x.txt": ""}, ["replay", "T/run"],
                                                ["T/run/h200_run", "no unit of granikv on llama-3.1-8b"]),
    "loro: one run (was exit 1)": ({}, ["loro", "A1", "--root", "T", "--out", "T/o"], ["at least two runs"]),
    "loro: no such run (was exit 1)": ({}, ["loro", "A1", "A2", "--root", "T", "--out", "T/o"],
                                       ["T/runA1/h200_run", "no such run folder"]),
    "clock-term: sustained JSON a list": ({"run/x.txt": "", "s.json": "[1, 2]"},
                                          ["clock-term", "T/run", "--sustained", "T/s.json"],
                                          ["T/s.json", "not a sustained-load JSON"]),
    "clock-term: sustained JSON not JSON": ({"run/x.txt": "", "s.json": "{"},
                                            ["clock-term", "T/run", "--sustained", "T/s.json"],
                                            ["T/s.json", "not a sustained-load JSON"]),
    "summary: unit without step_errors": ({f"raw/m/h200_run/validation_{UNIT}.json": '{"end_to_end": {}}'},
                                          ["summary", "T/raw", "--out", "T/s.json"],
                                          [f"T/raw/m/h200_run/validation_{UNIT}.json", "step_errors"]),
    "targets: report without workloads": ({"runs/runA/h200.json": "{}", "runs/runB/h200.json": "{}"},
                                          ["targets", "A", "B", "--root", "T/runs"],
                                          ["T/runs/runA/h200.json", "not a `granisim validation report` output"]),
    "targets --profile-check: report without workloads": (
        {"runs/runA/sub/h200.json": '{"workloads": []}'},
        ["targets", "A", "--root", "T/runs", "--profile-check", "sub"],
        ["T/runs/runA/sub/h200.json", "not a `granisim validation report` output"]),
    "idle-effect: unit JSON without wall_s": ({f"r/validation_{UNIT}.json": "{}", f"r/{UNIT}/steps.parquet": ""},
                                              ["idle-effect", "--idle", "T/r", "--no-idle", "T/r"],
                                              [f"T/r/validation_{UNIT}.json", "wall_s"]),
    "report: no such run (named 'no unit ... to fit on')": ({}, ["report", "T/none", "--out", "T/o"],
                                                            ["T/none", "no such run folder"]),
    "report: no such --fit-runs run": ({f"run/{UNIT}/steps.parquet": ""},
                                       ["report", "T/run", "--out", "T/o", "--fit-runs", "T/none"],
                                       ["T/none", "no such run folder"]),
    "report: plans.pkl not a pickle": ({f"run/{UNIT}/steps.parquet": "", f"run/{UNIT}/plans.pkl": "garbage\n"},
                                       ["report", "T/run", "--out", "T/o"],
                                       [f"T/run/{UNIT}/plans.pkl", "not a run's pickled plans"]),
    "verb argument: not an int (usage block before)": ({}, ["host-probe", "--repeats", "x"],
                                                       ["--repeats", "'x'"]),
    "verb argument: ap.error (usage block before)": ({}, ["sensitivity", "--delta", "2"], ["--delta 2.0"]),
}


@pytest.mark.parametrize("files,argv,needles", CASES.values(), ids=CASES.keys())
def test_bad_verb_input(tmp_path, capsys, files, argv, needles):
    for rel, text in files.items():
        _write(tmp_path / rel, text)

    def t(s: str) -> str:
        return str(tmp_path) + s[1:] if s == "T" or s.startswith("T/") else s

    _one_line_error(capsys, ["validation", *map(t, argv)], *map(t, needles))


# --- rescore: a real run (a tiny scenario on a noisy stand-in engine) with one file broken ----------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from granisim.config.scenario import load_scenario
    from granisim.experiments.run import prepare
    from granisim.validation.validate import validate
    from tests.granisim.simhelpers import TINY_TOML, NoisyEngine

    root = tmp_path_factory.mktemp("rescore")
    path = _write(root / "s.toml", 'name = "tiny-bad-rescore"\n' + TINY_TOML + '[hardware]\nprofile = "h200-engine"\n')
    setup = prepare(load_scenario(path), str(path))
    validate(setup, NoisyEngine(setup, 0, 0.8, 1.25), root / "run", progress=False)
    return root


@pytest.mark.parametrize("name,content,needle", [
    ("validation.json", "[1]", "not a validation report"),
    ("validation.json", '{"end_to_end": {"throughput_rps": 3}}', "not a validation report"),
    ("plans.pkl", pickle.dumps({"a": 1}), "not a run's pickled plans"),
    ("plans.pkl", b"garbage\n", "not a run's pickled plans"),
], ids=["report a list", "figure not an object", "plans a dict", "plans not a pickle"])
def test_rescore_names_the_broken_file(run, tmp_path, capsys, name, content, needle):
    import shutil

    broken = tmp_path / "run"
    shutil.copytree(run / "run", broken)
    (broken / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    _one_line_error(capsys, ["validation", "rescore", str(broken), "--scenario", str(run / "s.toml")],
                    str(broken / name), needle)


def test_rescore_refuses_a_scenario_the_run_did_not_run(run, tmp_path, capsys):
    other = _write(tmp_path / "other.toml", (run / "s.toml").read_text().replace("seed = 5", "seed = 6"))
    _one_line_error(capsys, ["validation", "rescore", str(run / "run"), "--scenario", str(other)],
                    str(other), "not the scenario")


def test_rescore_of_the_intact_run_still_works(run, capsys):
    assert main(["validation", "rescore", str(run / "run"), "--scenario", str(run / "s.toml")]) == 0
    assert "| granikv |" in capsys.readouterr().out


def test_rescore_prints_nothing_before_a_missing_file(run, tmp_path, capsys):
    """The second of two runs lacks its plans: one error line and no table at all, not a table header followed by
    the error. catches: the header printed before the runs' files are checked."""
    import shutil

    broken = tmp_path / "run"
    shutil.copytree(run / "run", broken)
    (broken / "plans.pkl").unlink()
    assert main(["validation", "rescore", str(run / "run"), str(broken), "--scenario", str(run / "s.toml")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and str(broken / "plans.pkl") in err, (out, err)
