"""A capacity search's finished probes on disk, so that a search run again with the same ``--out`` resumes.

Each probe is a full simulation of one scenario (a rate, a fleet size, a router, a policy). When it
finishes, its summary is appended to ``OUT/probes.jsonl`` as one line keyed by the probed scenario's
content (sha256 of its JSON dump). A search started again over the same folder reads those lines and
simulates only the probes it has not got: an interrupted search (Ctrl-C, a killed job) loses at most
the probes that were running. Probes are reused only for the identical scenario; the profile and the
code are not in the key, so after changing either start a new folder (or delete ``probes.jsonl``), as
with a sweep's results.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

FILE = "probes.jsonl"


def scenario_key(scenario) -> str:
    blob = json.dumps(scenario.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class ProbeLog:
    """``OUT/probes.jsonl``: ``run(scenario, simulate)`` -> (summary, False) if kept, else simulates and keeps it
    -> (summary, True)."""

    def __init__(self, out: Path):
        self.path = Path(out) / FILE
        self.kept: dict[str, dict] = {}
        self._cut = False  # the file ends inside a line (a write cut short by a kill): the next line starts anew
        if self.path.exists():
            text = self.path.read_text()
            self._cut = bool(text) and not text.endswith("\n")
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                    self.kept[row["key"]] = row["summary"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut short by a kill: that probe runs again

    def run(self, scenario, simulate: Callable[[], dict], label: str = "") -> tuple[dict, bool]:
        key = scenario_key(scenario)
        if key in self.kept:
            return self.kept[key], False
        summary = simulate()
        self.kept[key] = summary
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = ("\n" * self._cut + json.dumps({"key": key, "label": label, "summary": summary}) + "\n").encode()
        self._cut = False
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:  # one write of one line: probes of parallel searches append whole lines
            os.write(fd, line)
        finally:
            os.close(fd)
        return summary, True


def tidy(out: Path) -> None:
    """Rewrite a finished search's ``OUT/probes.jsonl`` in a fixed order (by label, then key), once per probe:
    parallel searches append in the order their probes finish, so the same search run twice would leave the
    same lines in different orders. Written to a temporary name and renamed (a kill leaves the old file)."""
    path = Path(out) / FILE
    if not path.exists():
        return
    rows: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            rows[row["key"]] = row
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by a kill (its probe ran again and has a line of its own)
    ordered = sorted(rows.values(), key=lambda r: (str(r.get("label", "")), r["key"]))
    tmp = path.with_name(FILE + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    os.replace(tmp, path)
