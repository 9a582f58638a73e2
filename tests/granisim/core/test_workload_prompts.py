"""Prompts drawn lazily as int32 hold exactly the tokens of drawing every prompt up front."""

import gc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from granisim.config.scenario import parse_scenario
from granisim.core.workload import SuffixStream, Workload, load_trace, rng_for

TRACE = load_trace()


def workload(kind="multi_agent", n=200, **wl):
    cfg = {"kind": kind, "num_requests": n, "rate": 5.0, **wl}
    if kind == "multi_agent":
        cfg.setdefault("roles", 3)
        cfg.setdefault("prefix_len", 32)
    sc = parse_scenario({"name": "t", "seed": 7, "workload": cfg})
    return Workload(sc.workload, sc.seed, TRACE)


def eager_prompts(wl: Workload, specs) -> dict[int, list[int]]:
    """The draw as it was: every suffix in request order from one int64 stream, up front."""
    gen = rng_for(wl.seed, "suffix_tokens")
    return {s.rid: s.prefix.tolist() + gen.integers(0, wl.vocab, s.suffix_source.size, dtype=np.int64).tolist()
            for s in specs}


SMALL = workload(n=150, suffix_scale=0.05)  # ~50-token suffixes: many requests per redraw mark
SMALL_WANT = eager_prompts(SMALL, SMALL.initial())


@settings(max_examples=20, deadline=None)
@given(order=st.lists(st.integers(0, 149), max_size=40), keep=st.booleans())
def test_any_read_order_gives_the_up_front_tokens(order, keep):
    """Reads in any order (skips, rereads after the array was dropped, reads behind the cursor)
    return the eagerly drawn tokens. Shown to catch planted bugs: redrawing from the mark one
    request late, and not skipping unread requests' suffixes, both fail here."""
    specs = SMALL.initial()
    held = []
    for i in order + list(range(150)):
        got = specs[i].prompt()
        assert got.dtype == np.int64 and got.tolist() == SMALL_WANT[i]
        assert specs[i].suffix.dtype == np.int32
        if keep:
            held.append(specs[i].suffix)


def test_azure_replay_prompts_match_and_are_not_held_up_front():
    wl = workload("azure", n=0, arrivals="trace")
    specs = wl.initial()
    assert len(specs) == len(TRACE)
    stream = specs[0].suffix_source._stream
    assert isinstance(stream, SuffixStream) and stream._next == 0  # nothing drawn yet
    assert sum(s.prompt_len for s in specs) == int(TRACE.num_prefill_tokens.sum())
    assert stream._next == 0  # prompt lengths come without drawing
    want = eager_prompts(wl, specs[:300])
    for s in specs[:300]:
        assert s.prompt().tolist() == want[s.rid]


def test_a_read_suffix_is_freed_with_its_last_holder():
    wl = workload()
    specs = wl.initial()
    arr = specs[5].suffix
    ref = specs[5].suffix_source._ref
    assert ref() is arr and specs[5].suffix is arr  # held: read again without a redraw
    del arr
    gc.collect()
    assert ref() is None
    assert specs[5].suffix.tolist() == eager_prompts(wl, specs)[5][wl.cfg.prefix_len:]


def test_follow_up_turns_keep_their_tokens():
    """A follow-up turn's prompt = previous prompt + its outputs + new tokens drawn as before."""
    wl = workload(turns=3, think_time_s=1.0)
    spec = wl.initial()[4]
    outputs = np.arange(spec.output_len, dtype=np.int64) % 1000
    nxt = wl.follow_up(spec, outputs, 10.0)
    gen = rng_for(wl.seed, f"followup/{spec.session}/1")
    n = max(1, int(TRACE["num_prefill_tokens"].iloc[int(gen.integers(len(TRACE)))] * wl.cfg.suffix_scale
                   * wl.cfg.followup_scale))
    new = gen.integers(0, wl.vocab, n, dtype=np.int64)
    think = float(gen.exponential(wl.cfg.think_time_s))
    assert nxt.suffix.dtype == np.int32
    assert nxt.prompt().tolist() == spec.prompt().tolist() + outputs.tolist() + new.tolist()
    assert nxt.arrival_s == 10.0 + think


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.integers(0, 9), min_size=1, max_size=150),
       vocab=st.sampled_from([1, 2, 7, 32000, 128256, 2**31 - 1]), seed=st.integers(0, 2**32 - 1),
       order=st.lists(st.integers(0, 149), max_size=20))
def test_a_chunk_of_suffixes_holds_the_tokens_of_one_draw_per_request(lens, vocab, seed, order):
    """SuffixStream draws MARK_EVERY requests' suffixes in one call: the same tokens as one call per
    request (odd lengths and empty suffixes included, so the 64-bit draw's unused half carries over),
    read in order, out of order and again. Shown to catch a planted bug: a part starting one token late."""
    gen = np.random.default_rng(seed)
    want = [gen.integers(0, vocab, n, dtype=np.int32).tolist() for n in lens]
    stream = SuffixStream(np.random.default_rng(seed), np.array(lens), vocab)
    for i in [i for i in order if i < len(lens)] + list(range(len(lens))):
        got = stream.draw(i)
        assert got.dtype == np.int32 and got.tolist() == want[i]


def test_a_suffix_of_millions_of_tokens_is_not_drawn_with_the_others():
    """A trace row may ask for billions of prompt tokens: such a request is rejected on arrival and its
    tokens never read, but drawing its chunk's suffixes in one call drew its tokens too (a 3-row trace
    with one 3e9-token prompt took 23 GB and 34 s). Suffixes over SuffixStream.LONG (4M) tokens stay out
    of the chunks: the others keep their tokens, and a long one draws from a stream of its own if read."""
    huge = (1 << 22) + 1
    lens = np.array([5, huge, 7, 3])
    gen = np.random.default_rng(11)
    want = [gen.integers(0, 100, n, dtype=np.int32).tolist() for n in (5, 0, 7, 3)]
    stream = SuffixStream(np.random.default_rng(11), lens, 100)
    for i in (3, 0, 2):
        assert stream.draw(i).tolist() == want[i]
    assert stream._chunk[1].size == 15  # the chunk holds the others' tokens only
    own = stream.draw(1)
    assert own.size == huge and own.dtype == np.int32 and np.array_equal(own, stream.draw(1))


def test_a_follow_up_message_of_millions_of_tokens_is_drawn_only_if_read(tmp_path):
    """followup_scale (or a long row of the lengths trace) can make a follow-up message of millions or
    billions of tokens; such a turn is rejected on arrival, but its tokens were drawn when it was made
    (followup_scale = 1e7 asked for 16 GB and died with a MemoryError traceback). A message over
    SuffixStream.LONG tokens is drawn when the turn's suffix is read, the same tokens on every read."""
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n1000,8\n")
    wl = workload(turns=2, think_time_s=1.0, followup_scale=5000.0, lengths_trace=str(lengths))
    spec = wl.initial()[4]
    outputs = np.arange(spec.output_len, dtype=np.int64) % 1000
    nxt = wl.follow_up(spec, outputs, 10.0)
    assert not isinstance(nxt.suffix_source, np.ndarray)  # nothing drawn yet
    assert nxt.prompt_len == spec.prompt_len + 8 + 5_000_000 and nxt.arrival_s > 10.0
    again = wl.follow_up(spec, outputs, 10.0)
    assert again.arrival_s == nxt.arrival_s
    got = nxt.suffix
    head = spec.suffix.tolist() + outputs.tolist()
    assert got.dtype == np.int32 and got.size == nxt.suffix_source.size
    assert got[: len(head)].tolist() == head and np.array_equal(got, again.suffix)
    assert got[len(head):].min() >= 0 and got.max() < wl.vocab
