"""Host integer helpers for grids and tiles, in plain Python: `triton.cdiv` and
`triton.next_power_of_2` are jit-aware wrappers that cost ~5 us a call on the host (triton 3.7),
and a launcher calls them several times per launch."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()
