"""The process's memory around a simulation: fewer garbage collections during it, and the C heap's
free pages given back to the system after it.

A run leaves most of the memory it used in the C heap when it ends: the requests' token and
slot buffers of the busiest moment, the KV allocator's arrays. The allocator keeps freed blocks
(and their pages) for later allocations, so the process stays that large while it builds the
frames, writes the outputs and plots. glibc's ``malloc_trim`` hands every free page back; on
other C libraries this does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator

# the thresholds a simulation runs under (fewer_collections); written as powers: hypothesis draws integers from
# the literals >= 100 of the code it tests, and a new one would change what a fuzz seed explores
SIMULATION = dict(young=10**4, full=10**2)


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()


def release_free_heap() -> None:
    """Return the C heap's free pages to the system (a few milliseconds; nothing without glibc)."""
    if _TRIM is not None:
        _TRIM(0)


@contextlib.contextmanager
def fewer_collections(young: int = 0, full: int = 0) -> Iterator[None]:
    """Python's cyclic garbage collector made less eager for the length of a run: collect the youngest
    generation after at least ``young`` new objects, and the whole heap after at least ``full`` collections
    of the middle one (0: keep the current threshold); the thresholds as they were afterwards.

    A simulation allocates few cyclic objects but keeps many alive (requests, radix nodes, columns), so
    at the default thresholds (700, 10, 10) the collector walks the growing heap again and again and
    finds little to free: 16 replicas on 16x the Azure trace spend about 2.7 s in 2,700 collections, 20
    of them full, and run 2-6% slower than with :data:`SIMULATION` (10**4, 10**2)
    (reports/sim_speed/README.md). Cyclic garbage waits longer; the peak resident memory is the same."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], young), old[1], max(old[2], full))
    try:
        yield
    finally:
        gc.set_threshold(*old)
