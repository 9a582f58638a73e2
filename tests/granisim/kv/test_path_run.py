"""The prefix-group test of whether a radix path's slots are one run, node by node with a cache."""

import random

import numpy as np
import pytest

from granisim.kv.radix import RadixNode
from granisim.kv.sequence import _is_run
from granisim.kv.views import _path_is_run


def _values(rng: random.Random) -> list[np.ndarray]:
    start, out = rng.randrange(0, 100), []
    for _ in range(rng.randrange(1, 6)):
        n = rng.choice((0, 1, 1, 3, 8))
        v = np.arange(start, start + n, dtype=np.int64)
        if n > 1 and rng.random() < 0.2:  # a permuted run spans the right range but is not one
            v = v[::-1].copy()
        out.append(v)
        start += n + (rng.random() < 0.2)  # now and then a gap before the next node
    return out


@pytest.mark.parametrize("seed", range(300))
def test_path_is_run_is_the_concatenation_is_run(seed):
    """Equal to ``_is_run`` of the concatenated slots, for runs, permuted runs, gaps and empty nodes,
    also after a node's value is replaced (as a split or a HOT move does). Planted bug caught: a node's
    cached answer reused after its value changed."""
    rng = random.Random(seed)
    path = [RadixNode(i, v.copy(), v, "hot", None) for i, v in enumerate(_values(rng))]

    def want():
        return _is_run(np.concatenate([n.value for n in path]))

    assert _path_is_run(path) == want()
    for _ in range(3):
        n = rng.choice(path)
        shift = rng.choice((0, 1, -1))
        n.value = n.value[::-1].copy() if rng.random() < 0.3 else n.value + shift
        assert _path_is_run(path) == want()
