"""Counters that lag a shared clock and catch up when read.

The scheduler's decoding requests (granisim.core.decode_batch) and the allocator's tracked
requests (KVAllocator.grow_tracked) take their steps on a clock counted once for all of them; each
object keeps its own counters as of its last catch-up and a method that adds the clock's steps
since then.
"""

from __future__ import annotations


def lagging(slot: str, clock: str, sync: str) -> property:
    """A property over the slot ``slot`` that first calls the object's method ``sync`` when its
    attribute ``clock`` is set (the object is on a clock), for reads and writes alike. Its functions
    are compiled for these names (as dataclasses compile ``__init__``): read on every step of a
    simulation, they cost what a hand-written property does."""
    for name in (slot, clock, sync):
        if not name.isidentifier():
            raise ValueError(f"lagging: {name!r} is not an attribute name")
    code = (f"def get(self):\n    if self.{clock} is not None:\n        self.{sync}()\n    return self.{slot}\n"
            f"def put(self, value):\n    if self.{clock} is not None:\n        self.{sync}()\n"
            f"    self.{slot} = value\n")
    ns: dict = {}
    exec(code, ns)  # noqa: S102 (fixed names, checked above)
    return property(ns["get"], ns["put"], doc=f"``{slot}``, caught up with the clock first")
