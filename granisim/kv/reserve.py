"""A reserve of KV tokens known as an upper bound at once and exactly on demand.

The scheduler holds back room for its running requests' outstanding outputs when it admits
another. The exact amount is a pass over the running requests; an upper bound is a few sums. An
admission that fits even with the bound needs no more, so :meth:`KVAllocator.can_admit
<granisim.kv.allocator.KVAllocator.can_admit>` asks for the exact value only when the bound does
not fit (and whenever adaptive HOT weighs the reserve in its growth).
"""

from __future__ import annotations

from collections.abc import Callable


class LazyReserve:
    """``bound`` >= the exact reserve; ``exact()`` computes it once (later calls, and every reserve
    made from this one by ``plus``, reuse it)."""

    __slots__ = ("bound", "_base", "_extra")

    def __init__(self, bound: int, exact: Callable[[], int] | list, extra: int = 0):
        self.bound = bound
        self._base = exact if isinstance(exact, list) else [exact, None]  # [compute, value once computed]
        self._extra = extra

    def exact(self) -> int:
        base = self._base
        if base[1] is None:
            base[1] = base[0]()
        return base[1] + self._extra

    def plus(self, n: int) -> LazyReserve:
        """This reserve with ``n`` more tokens (``n`` may be negative)."""
        return LazyReserve(self.bound + n, self._base, self._extra + n)


def exact(reserve: int | LazyReserve) -> int:
    return reserve if isinstance(reserve, int) else reserve.exact()
