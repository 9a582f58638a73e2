"""Rows appended one at a time, held as one numpy array per column (the step log, the request records).

Rows are buffered as tuples and packed every ``chunk`` rows into the column arrays, which
grow by doubling. A large column lives in its own private anonymous memory map (:func:`pages`):
only the pages written are resident, and an outgrown array goes back to the system when it is
dropped, whatever the C allocator does with freed memory (it keeps freed heap blocks, so arrays
grown and freed through it would stay resident as holes). A new map reads as zeros without
being resident, so a column whose values are all zero so far (the step log's unused paths and
pools: 9 of its 26 columns on the Azure replay) is never written, nor copied when it grows.
"""

from __future__ import annotations

import mmap

import numpy as np

MAP_BYTES = 1 << 16  # arrays at least this large get their own memory map
# private: reading a page never written maps the shared zero page (a shared map would commit it)
_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}


def pages(n: int, dtype) -> np.ndarray:
    """A writable array of ``n`` zeros; from ``MAP_BYTES`` bytes on, in its own anonymous memory
    map (a page is resident once written, and unmapped when the array and every view of it are gone)."""
    dt = np.dtype(dtype)
    nbytes = n * dt.itemsize
    if nbytes < MAP_BYTES:
        return np.zeros(n, dt)
    return np.frombuffer(mmap.mmap(-1, nbytes, **_PRIVATE), dt)


def _zero_bits(part: np.ndarray) -> bool:
    """Whether every value of a numeric array is stored as zero bytes (so not -0.0)."""
    return part.dtype.kind in "biuf" and not part.view(np.uint8).any()


class PackedRows:
    """Tuples of one width, appended; read back by row (:meth:`row`) or as column arrays (:meth:`arrays`).

    A column's dtype is that of ``np.array`` over its values (so of ``np.concatenate`` over the
    packed chunks: ints and floats give float64, and so on) unless ``dtypes`` names one (None
    entries are inferred). Arrays handed out by :meth:`arrays` are never written again: rows
    appended afterwards go into copies."""

    __slots__ = ("chunk", "_dtypes", "_rows", "_cols", "_zero", "_n", "_shared", "__weakref__")

    START = 4096  # rows a column array first holds

    def __init__(self, chunk: int = 1024, dtypes: tuple | None = None):
        self.chunk = chunk
        self._dtypes = dtypes
        self._rows: list[tuple] = []
        self._cols: list[np.ndarray] = []  # rows 0 .. _n - 1 are set
        self._zero: list[bool] = []  # column j's values are all zero bytes so far: left as pages() made it
        self._n = 0
        self._shared = False  # arrays() handed out views of _cols

    def __len__(self) -> int:
        return self._n + len(self._rows)

    def append(self, row: tuple) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.chunk:
            self.pack()

    def pack(self) -> None:
        """Move the buffered rows into the column arrays."""
        rows = self._rows
        if not rows:
            return
        n, k = self._n, len(rows)
        end = n + k
        shared, self._shared = self._shared, False
        given = self._dtypes
        for j, col_values in enumerate(zip(*rows)):
            part = np.array(col_values) if given is None or given[j] is None else np.array(col_values, given[j])
            if j == len(self._cols):
                self._cols.append(pages(max(self.START, k), part.dtype))
                self._zero.append(True)
            col, was_zero = self._cols[j], self._zero[j]
            dtype = np.result_type(col.dtype, part.dtype)
            if shared or end > col.size or dtype != col.dtype:
                grown = pages(max(end, 2 * col.size) if end > col.size else col.size, dtype)
                if not was_zero:
                    grown[:n] = col[:n]
                self._cols[j] = col = grown  # one column at a time: the outgrown array goes now
            if was_zero and _zero_bits(part):
                continue  # zeros already
            col[n:end] = part
            self._zero[j] = False
        self._n = end
        self._rows = []

    def arrays(self) -> list[np.ndarray]:
        """Every column as an array of ``len(self)`` items (views: not written again). Needs a row."""
        self.pack()
        self._shared = True
        n = self._n
        return [c[:n] for c in self._cols]

    def rows(self):
        """Every row in order, as :meth:`row` gives it (one ``tolist`` per column for the packed rows)."""
        n = self._n
        if n:
            yield from zip(*(c[:n].tolist() for c in self._cols))
        yield from list(self._rows)

    def row(self, i: int) -> tuple:
        """Row ``i`` (0 <= i < len) as Python values (of the column's type once packed: an int appended
        to a float column comes back as a float)."""
        n = self._n
        if i >= n:
            return self._rows[i - n]
        return tuple(c[i].item() for c in self._cols)
