"""Request: its token buffer is built on first read and sampled tokens reach it when read."""

import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from granisim.core.request import Request, stand_in_token, stand_in_tokens
from granisim.core.workload import LazySuffix, RequestSpec, SuffixStream

PREFIX = np.arange(100, 110, dtype=np.int32)


def spec(suffix_len=5, output_len=400):
    return RequestSpec(3, 0.0, PREFIX, np.arange(suffix_len, dtype=np.int32) + 500, output_len, PREFIX.size)


_step = st.one_of(st.tuples(st.just("one"), st.integers(0, 127_999)),
                  st.tuples(st.just("block"), st.lists(st.integers(0, 127_999), min_size=1, max_size=80)),
                  st.tuples(st.just("read")),
                  st.tuples(st.just("advance"), st.integers(1, 70)))


@settings(max_examples=200, deadline=None)
@given(st.lists(_step, max_size=30))
def test_tokens_read_back_every_append_in_order(steps):
    """Any mix of one-token and block appends (real engine ids up to 128K), read at any point,
    gives prompt + outputs in order, as int32 (the prompts' dtype); stand-in tokens (``advance``) read back as the
    stand-in of their output position. Shown to catch planted bugs: flushing the pending tokens
    one position early, or computing the stand-ins from the count after instead of before them
    (``self.generated`` for ``self.generated - synth``), fails here."""
    s = spec()
    r = Request(s)
    want = PREFIX.tolist() + (np.arange(5) + 500).tolist()
    assert r.n_tokens == r.prompt_len == len(want)
    for step in steps:
        if r.generated + {"block": lambda: len(step[1]), "advance": lambda: step[1]}.get(step[0], lambda: 1)() \
                > s.output_len:
            break
        if step[0] == "advance":
            want.extend(stand_in_token(s.rid, r.generated + i) for i in range(step[1]))
            r.advance(step[1])
        elif step[0] == "one":
            r.append_one(step[1])
            want.append(step[1])
        elif step[0] == "block":
            r.append(np.array(step[1], dtype=np.int64))
            want.extend(step[1])
        else:
            assert r.tokens[: r.n_tokens].tolist() == want
        assert r.n_tokens == len(want) and r.generated == len(want) - r.prompt_len
    assert r.tokens.dtype == np.int32 and r.tokens[: r.n_tokens].tolist() == want
    assert r.remaining_output == s.output_len - r.generated


def test_a_waiting_request_holds_no_buffer():
    r = Request(spec())
    assert r._buf is None and r.n_tokens == 15
    assert r.tokens.size == 15 + 400 and r._buf is not None


def test_stand_in_tokens_match_the_scalar_formula():
    """The block and scalar forms agree (the scalar one is what a one-step plan used to append)."""
    for rid in (0, 7, 123_456):
        assert stand_in_tokens(rid, 5, 40).tolist() == [stand_in_token(rid, 5 + i) for i in range(40)]


def test_a_running_request_holds_its_drawn_suffix_once():
    """Once a request's buffer is built, its spec's suffix is that part of the buffer: the drawn copy is
    freed (its weak reference dies), the values are the drawn ones, and a suffix read later is not redrawn.
    Shown to catch a planted bug: without ``share``, the spec's suffix is a new draw, not the buffer."""
    stream = SuffixStream(np.random.default_rng(7), np.array([6, 9]), 1000)
    want = SuffixStream(np.random.default_rng(7), np.array([6, 9]), 1000).draw(1).tolist()
    src = LazySuffix(stream, 1, 9)
    r = Request(RequestSpec(1, 0.0, PREFIX, src, 4, PREFIX.size))
    drawn = weakref.ref(r._suffix)
    tokens = r.tokens
    gc.collect()
    assert drawn() is None
    assert r.spec.suffix.tolist() == want == tokens[PREFIX.size : PREFIX.size + 9].tolist()
    assert np.shares_memory(r.spec.suffix, tokens)


def test_a_suffix_shared_with_other_tokens_names_them():
    src = LazySuffix(SuffixStream(np.random.default_rng(7), np.array([6]), 1000), 0, 6)
    with pytest.raises(ValueError, match="suffix 0: 5 int32 tokens cannot stand for 6 int32"):
        src.share(np.zeros(5, np.int32))
