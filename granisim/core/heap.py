"""Give the C heap's free pages back to the system after a simulation.

A run leaves most of the memory it used in the C heap when it ends: the requests' token and
slot buffers of the busiest moment, the KV allocator's arrays. The allocator keeps freed blocks
(and their pages) for later allocations, so the process stays that large while it builds the
frames, writes the outputs and plots. glibc's ``malloc_trim`` hands every free page back; on
other C libraries this does nothing.
"""

from __future__ import annotations

import ctypes


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
