"""A simulation's progress bar: tqdm's when shown, else one that does nothing.

A disabled tqdm bar still builds tqdm's multiprocessing write lock the first time one is made in a
process (about 4 ms of CPU), inside the simulation a benchmark times; a run without a bar needs
none of it.
"""

from __future__ import annotations


class NoBar:
    """The part of tqdm's interface the simulation loops use, doing nothing."""

    total = 0

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def request_bar(total: int, show: bool):
    """A bar of finished requests out of ``total`` (tqdm, shown after 2 s) or a NoBar."""
    if not show:
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="req", delay=2.0, leave=False)
