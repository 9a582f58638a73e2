"""Handing the C heap's free pages back after a run (glibc)."""

import os
from pathlib import Path

import numpy as np
import pytest

from granisim.core import heap


@pytest.mark.skipif(heap._TRIM is None or not Path("/proc/self/statm").exists(),
                    reason="needs glibc's malloc_trim and /proc")
def test_freed_heap_blocks_leave_the_resident_set():
    """80 MB of 20 KB arrays freed below a live one stay resident (the heap cannot shrink past the
    live block), and release_free_heap hands most of them back."""

    def resident() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    blocks = [np.ones(2500) for _ in range(4000)]
    last = blocks[-1]
    del blocks
    before = resident()
    heap.release_free_heap()
    assert before - resident() > 40 * 2**20 and last.sum() == 2500


def test_release_free_heap_without_glibc_does_nothing(monkeypatch):
    monkeypatch.setattr(heap, "_TRIM", None)
    heap.release_free_heap()


def test_fewer_collections_raises_thresholds_for_the_run_only():
    """Inside: the youngest and the full-collection thresholds at least those asked for (never lowered, the
    middle one kept); afterwards, also after an error, the thresholds as they were."""
    import gc

    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with heap.fewer_collections(**heap.SIMULATION):
            assert gc.get_threshold() == (10**4, 10, 10**2)
        assert gc.get_threshold() == (700, 10, 10)
        with pytest.raises(RuntimeError), heap.fewer_collections(young=10**4):
            assert gc.get_threshold() == (10**4, 10, 10)
            raise RuntimeError
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(2 * 10**4, 5, 10**3)
        with heap.fewer_collections(young=10**4, full=10**2):
            assert gc.get_threshold() == (2 * 10**4, 5, 10**3)
    finally:
        gc.set_threshold(*old)


def test_a_simulation_runs_under_fewer_collections(monkeypatch):
    """`simulate` runs the serving loop with the SIMULATION thresholds and restores them."""
    import gc

    from granisim.config.scenario import parse_scenario
    from granisim.core import serving_loop
    from granisim.experiments.run import prepare, simulate

    seen = []
    run = serving_loop.ServingLoop.run
    monkeypatch.setattr(serving_loop.ServingLoop, "run", lambda self: seen.append(gc.get_threshold()) or run(self))
    old = gc.get_threshold()
    setup = prepare(parse_scenario({"name": "gc", "workload": {"kind": "multi_agent", "num_requests": 4}}))
    assert len(simulate(setup, progress=False).records) == 4
    assert seen == [(max(old[0], 10**4), old[1], max(old[2], 10**2))] and gc.get_threshold() == old
