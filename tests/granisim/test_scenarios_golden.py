"""Golden seeded summaries for every file in scenarios/ (a behaviour change shows in review).

Regenerate after an intended change with: GRANISIM_UPDATE_GOLDEN=1 pytest tests/granisim/test_scenarios_golden.py
"""

import json
import math
import os
from pathlib import Path

import pytest

from granisim.core.metrics import requests_frame, summarize
from granisim.config.scenario import load_scenario
from granisim.experiments.run import prepare, simulate

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
FILES = sorted((ROOT / "scenarios").glob("*.toml"))
MAX_REQUESTS = 150  # keeps the suite fast; recorded in the golden file


def _summary(path: Path) -> dict:
    sc = load_scenario(path)
    n = sc.workload.num_requests
    sc = sc.with_changes(**{"workload.num_requests": min(n, MAX_REQUESTS) if n else MAX_REQUESTS})
    setup = prepare(sc, str(path))
    res = simulate(setup, progress=False)
    s = summarize(requests_frame(res.records), res.steps.frame(), res.end_s)
    s["num_requests_run"] = sc.workload.num_requests
    return s


def test_every_scenario_has_a_golden_file():
    """scenarios/*.toml and tests/golden/*.json name the same set: a scenario without a golden file (it would
    only be written, never compared, on a fresh checkout) or a golden file whose scenario was renamed or removed
    (a check that silently stopped running) fails here. Planted bug: deleting tests/golden/azure_replay.json, or
    adding a stray tests/golden/old_name.json, fails this test."""
    scenarios = {f.stem for f in FILES}
    goldens = {g.stem for g in GOLDEN.glob("*.json")}
    assert scenarios, "no scenario files found"
    assert scenarios - goldens == set(), "scenarios without a golden file"
    assert goldens - scenarios == set(), "golden files without a scenario"


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_golden_summary(path):
    got = _summary(path)
    gold = GOLDEN / f"{path.stem}.json"
    if os.environ.get("GRANISIM_UPDATE_GOLDEN") or not gold.exists():
        GOLDEN.mkdir(exist_ok=True)
        gold.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        if not os.environ.get("GRANISIM_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden file {gold.name}; review and commit it")
    want = json.loads(gold.read_text())
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(got[k]), k
        else:
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
