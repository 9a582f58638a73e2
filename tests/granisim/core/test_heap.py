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
