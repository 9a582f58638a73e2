"""Workloads: what arrives when, with which tokens.

* ``multi_agent`` — ``roles`` agent roles, each with its own prefix of ``prefix_len``
  tokens (declared shared), chosen uniformly or by Zipf popularity; per-request suffix
  and output lengths drawn from a real trace (Azure LLM inference, conversation, 2023);
  Poisson arrivals at ``rate`` or the trace's own timestamps; optional multi-turn sessions
  in which each turn's prompt is the previous turn's prompt + its output + a new suffix.
* ``control`` — the same, meant with a short prefix (set ``prefix_len``, e.g. 64: its default is
  ``multi_agent``'s).
* ``azure`` — replay of the trace itself: its timestamps and lengths, no shared prefix.

``lengths_trace`` (any kind): prompt and output lengths drawn from another trace that has
lengths only (e.g. the shipped arXiv-summarization long prompts), arrivals as before (e.g. the
Azure trace's timestamps).

Every random stream has its own generator seeded from (seed, stream name), so changing
one knob (say, role popularity) leaves the other streams' draws unchanged.

Token ids are held as int32 (any vocabulary fits). The initial requests' suffix tokens are
drawn lazily, when a request first reads them (normally on arrival, in request order),
from the one ``suffix_tokens`` stream in request order — the same values as drawing them
all up front, without holding every prompt in memory.
"""

from __future__ import annotations

import csv
import functools
import heapq
import io
import weakref
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from granisim.frozen import slot_setters

VOCAB = 32000  # synthetic token ids; only equality matters to the radix index
AZURE_CONV = "azure_conv_2023.csv"
# shipped length-only traces (workload.lengths_trace = NAME): prompt/output lengths without timestamps
LENGTHS_TRACES = {"arxiv": "arxiv_summarization_lengths.csv"}
LENGTH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
PROMPT_DTYPE = np.int32


class SuffixStream:
    """The initial requests' suffix tokens: one generator, drawn in request order on demand.

    Reading request ``i`` first skips (draws and drops) the suffixes of the requests before
    it that were never read (rejected on arrival, say). A suffix read again after it was
    dropped, or read after a later one, is redrawn from the generator state saved every
    ``MARK_EVERY`` requests. Values never depend on the order of reads.

    The generator draws the suffixes of ``MARK_EVERY`` requests in one call (a chunk: from one mark
    to the next) and hands each request a view of its part. The bit generator keeps the unused half
    of a 64-bit draw between calls and bounded integers take one 32-bit draw each (with Lemire's
    rejection), so the chunk holds the tokens of drawing its requests one call each; one call
    instead of 64 is what saves time (most of a small draw is the call's own overhead).
    """

    MARK_EVERY = 64
    # a suffix longer than this (a trace row of millions of tokens: rejected on arrival, never read) is left
    # out of the chunks and drawn, if ever read, from a generator of its own: else any read in its chunk
    # would draw all of its tokens
    LONG = 1 << 22

    def __init__(self, gen: np.random.Generator, lengths: np.ndarray, vocab: int):
        self._gen = gen
        self._lengths = lengths
        self._vocab = vocab
        self._next = 0  # the request whose suffix is handed out next (the generator is at its chunk's end)
        self._marks: dict[int, dict] = {}  # request index (multiple of MARK_EVERY) -> generator state
        self._chunk: tuple[int, np.ndarray, list[int]] | None = None  # (first request, tokens, offsets)

    def __len__(self) -> int:
        return len(self._lengths)

    def draw(self, i: int) -> np.ndarray:
        if self._lengths[i] > self.LONG:
            return self._own(i)
        if i < self._next:
            return self._redraw(i)
        while self._next < i:
            self._take()
        return self._take()

    def _take(self) -> np.ndarray:
        i = self._next
        if i % self.MARK_EVERY == 0:
            self._marks[i] = self._gen.bit_generator.state
            self._chunk = self._draw_chunk(self._gen, i)
        self._next += 1
        return self._part(self._chunk, i)

    def _draw_chunk(self, gen: np.random.Generator, start: int) -> tuple[int, np.ndarray, list[int]]:
        """The suffixes of requests ``start .. start + MARK_EVERY`` (fewer at the end) in one draw."""
        lens = self._lengths[start : start + self.MARK_EVERY]
        lens = np.where(lens > self.LONG, 0, lens)
        offsets = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).tolist()
        return start, gen.integers(0, self._vocab, offsets[-1], dtype=PROMPT_DTYPE), offsets

    @staticmethod
    def _part(chunk: tuple[int, np.ndarray, list[int]], i: int) -> np.ndarray:
        start, tokens, offsets = chunk
        k = i - start
        # a view: the chunk lives while one of its suffixes is held (a request copies its suffix into its
        # own buffer when admitted, then lets go of it), no copy per request
        return tokens[offsets[k] : offsets[k + 1]]

    def _own(self, i: int) -> np.ndarray:
        """A long suffix (over ``LONG`` tokens), from its own generator: spawned from the stream's seed by
        request index, so it does not depend on the order of reads."""
        seq = self._gen.bit_generator.seed_seq
        own = np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, i)))
        return own.integers(0, self._vocab, int(self._lengths[i]), dtype=PROMPT_DTYPE)

    def _redraw(self, i: int) -> np.ndarray:
        start = i - i % self.MARK_EVERY
        gen = np.random.Generator(type(self._gen.bit_generator)())
        gen.bit_generator.state = self._marks[start]
        return self._part(self._draw_chunk(gen, start), i)


class LazySuffix:
    """Request ``index``'s suffix in a :class:`SuffixStream`, drawn when first read and kept only
    while someone (its running request) holds the array."""

    __slots__ = ("size", "_stream", "_index", "_ref")

    def __init__(self, stream: SuffixStream, index: int, size: int):
        self.size = size
        self._stream = stream
        self._index = index
        self._ref: weakref.ref | None = None

    def get(self) -> np.ndarray:
        arr = self._ref() if self._ref is not None else None
        if arr is None:
            arr = self._stream.draw(self._index)
            self._ref = weakref.ref(arr)
        return arr

    def share(self, arr: np.ndarray) -> None:
        """``arr`` (the same tokens, e.g. the part of a running request's buffer that holds them) stands for
        the suffix from now on, so the drawn array is freed once its holder lets go of it."""
        if arr.size != self.size or arr.dtype != PROMPT_DTYPE:
            raise ValueError(f"suffix {self._index}: {arr.size} {arr.dtype} tokens cannot stand for "
                             f"{self.size} {np.dtype(PROMPT_DTYPE)}")
        self._ref = weakref.ref(arr)


class LongMessage:
    """A follow-up turn's suffix whose new message is over ``SuffixStream.LONG`` tokens: the previous suffix,
    its outputs and the message, put together when read (``draw``, through a :class:`LazySuffix`), the
    message from its own generator (saved state: the same tokens on every read)."""

    def __init__(self, previous, outputs: np.ndarray, gen: np.random.Generator, length: int, vocab: int):
        self._previous = previous  # the previous turn's suffix source (an array or a LazySuffix)
        self._outputs = np.asarray(outputs).astype(PROMPT_DTYPE)
        self._bits, self._state = type(gen.bit_generator), gen.bit_generator.state
        self._length = length
        self._vocab = vocab
        self.size = int(previous.size) + self._outputs.size + length

    def draw(self, _index: int = 0) -> np.ndarray:
        prev = self._previous
        prev = prev.get() if isinstance(prev, LazySuffix) else prev
        gen = np.random.Generator(self._bits())
        gen.bit_generator.state = self._state
        return np.concatenate([prev, self._outputs, gen.integers(0, self._vocab, self._length, dtype=PROMPT_DTYPE)])


@dataclass(frozen=True, slots=True)
class RequestSpec:
    rid: int
    arrival_s: float
    prefix: np.ndarray  # shared part of the prompt (a role's system prompt); may be empty
    suffix_source: np.ndarray | LazySuffix  # per-request part of the prompt (read it as ``suffix``)
    output_len: int
    shared_len: int  # tokens of the prompt declared shared (the role prefix)
    role: int = -1
    session: int = -1
    turn: int = 0
    started: bool = False  # handed back by a fleet replica that had admitted it: no queue timeout since

    @property
    def suffix(self) -> np.ndarray:
        src = self.suffix_source
        return src.get() if isinstance(src, LazySuffix) else src

    @property
    def prompt_len(self) -> int:
        return int(self.prefix.size + self.suffix_source.size)

    def prompt(self) -> np.ndarray:
        """The whole prompt as int64 token ids."""
        return np.concatenate([self.prefix, self.suffix]).astype(np.int64, copy=False)


_SPEC_SET = slot_setters(RequestSpec)


def request_spec(rid: int, arrival_s: float, prefix: np.ndarray, suffix_source, output_len: int, shared_len: int,
                 role: int = -1, session: int = -1, turn: int = 0, started: bool = False) -> RequestSpec:
    """``RequestSpec(...)`` (an equal object) without the frozen ``__init__``'s per-field calls: one per request."""
    o = object.__new__(RequestSpec)
    a, b, c, d, e, f, g, h, i, j = _SPEC_SET
    a(o, rid)
    b(o, arrival_s)
    c(o, prefix)
    d(o, suffix_source)
    e(o, output_len)
    f(o, shared_len)
    g(o, role)
    h(o, session)
    i(o, turn)
    j(o, started)
    return o


def rng_for(seed: int, stream: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(stream.encode())])


TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


class TraceError(ValueError):
    """A malformed trace CSV: one line naming the file, the row (1 = first row after the header),
    the column and the value."""


def load_trace(path: str | Path | None = None) -> pd.DataFrame:
    """The Azure conversation trace (bundled copy) or a user CSV with the same columns.

    Every row is checked (:func:`check_trace`); a missing file raises FileNotFoundError, an
    unreadable one OSError, anything else wrong with it TraceError."""
    name = str(path) if path is not None else AZURE_CONV
    raw = (resources.files("granisim.config.data").joinpath(AZURE_CONV).read_bytes() if path is None
           else Path(path).read_bytes())
    return check_trace(read_csv_table(raw, name, TRACE_COLUMNS), name)


def read_csv_table(raw: bytes, name: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """A CSV file's bytes as a table, or TraceError naming ``name``: not UTF-8 (the first bad byte's offset), empty
    (``columns`` is the header it needs), a column named twice, or a row with more or fewer fields than the header
    (pandas would shift such a row's values into other columns, or leave them empty, without a word). A UTF-8 byte
    order mark, blank lines and CRLF line ends are fine."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"{name}: not UTF-8 text (byte at offset {err.start})") from None
    rows = (r for r in csv.reader(io.StringIO(text, newline="")) if r)  # pandas skips blank lines too
    header = next(rows, None)
    if header is None:
        raise TraceError(f"{name}: the file is empty (need a header row {','.join(columns)})")
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise TraceError(f"{name}: column {twice[0]!r} appears {header.count(twice[0])} times in the header")
    for i, row in enumerate(rows, 1):
        if len(row) != len(header):
            raise TraceError(f"{name}: row {i} has {len(row)} fields, the header {len(header)} "
                             f"({','.join(header)[:120]})")
    try:
        return pd.read_csv(io.StringIO(text), index_col=False)
    except pd.errors.ParserError as err:
        raise TraceError(f"{name}: not a readable CSV ({' '.join(str(err).split())[:200]})") from None


def check_trace(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """The trace with its three columns numeric, or TraceError for the first bad cell: a value
    that is not a finite number, a token count that is not an integer >= 1, a timestamp earlier
    than the row before (rows must be in arrival order). Nothing is clamped, dropped or sorted."""
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{name}: trace is missing column(s) {', '.join(missing)} "
                         f"(need {', '.join(TRACE_COLUMNS)}; has {', '.join(map(str, df.columns))[:120]})")
    if len(df) == 0:
        raise TraceError(f"{name}: the trace has no rows")

    def bad(col: str, i: int, why: str) -> TraceError:
        v = df[col].iloc[i]
        v = v.item() if hasattr(v, "item") else v
        r = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        return TraceError(f"{name}: row {i + 1}, column {col} = {r}: {why}")

    out = df.copy() if any(df[c].dtype.kind not in "iuf" for c in TRACE_COLUMNS) else df
    for col in TRACE_COLUMNS:
        if df[col].dtype.kind == "b":
            raise bad(col, 0, "not a number")
        vals = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        nonfinite = ~np.isfinite(vals)
        if nonfinite.any():
            raise bad(col, int(np.argmax(nonfinite)), "not a finite number")
        if col != "arrived_at":
            wrong = (vals < 1) | (vals != np.floor(vals))
            if wrong.any():
                raise bad(col, int(np.argmax(wrong)), "a token count must be an integer >= 1")
            huge = vals >= 2.0**53  # beyond it float64 skips integers (and int64 lengths overflow when scaled)
            if huge.any():
                raise bad(col, int(np.argmax(huge)), "a token count must stay below 2^53")
        elif len(vals) > 1:
            back = np.diff(vals) < 0
            if back.any():
                i = int(np.argmax(back)) + 1
                raise bad(col, i, f"earlier than row {i} ({vals[i - 1]:g}): rows must be in arrival order")
        if out is not df:
            out[col] = pd.to_numeric(df[col])
    return out


def load_lengths(ref: str) -> pd.DataFrame:
    """A lengths trace (``workload.lengths_trace``): a shipped name (``arxiv``: arXiv summarization,
    from microsoft/vidur) or a CSV path with ``num_prefill_tokens`` and ``num_decode_tokens``
    (integers >= 1; other columns ignored). Read once per process. Errors as :func:`load_trace`'s."""
    return _load_lengths(ref).copy()


@functools.lru_cache(maxsize=8)
def _load_lengths(ref: str) -> pd.DataFrame:
    raw = (resources.files("granisim.config.data").joinpath(LENGTHS_TRACES[ref]).read_bytes()
           if ref in LENGTHS_TRACES else Path(ref).read_bytes())
    df = read_csv_table(raw, ref, LENGTH_COLUMNS)
    missing = [c for c in LENGTH_COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{ref}: missing column(s) {', '.join(missing)} (need {', '.join(LENGTH_COLUMNS)})")
    # the same cell checks as a full trace (a constant arrival column passes the order check)
    checked = check_trace(df[list(LENGTH_COLUMNS)].assign(arrived_at=0.0), ref)
    return checked[list(LENGTH_COLUMNS)].reset_index(drop=True)


class InitialSpecs:
    """The initial requests' specs, built on reading: ``specs[i]`` is a new ``RequestSpec`` equal to the
    one an up-front list would hold (the same ``LazySuffix`` draws). ``times`` are the arrival times in
    request order."""

    def __init__(self, times: np.ndarray, suffix_lens: np.ndarray, out_lens: np.ndarray,
                 roles: np.ndarray | None, prefixes: list[np.ndarray], stream: SuffixStream, sessions: bool):
        self.times = times
        self._suffix_lens = suffix_lens
        self._out_lens = out_lens
        self._roles = roles
        self._prefixes = prefixes
        self._stream = stream
        self._sessions = sessions
        self._no_prefix = np.empty(0, PROMPT_DTYPE)

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, i: int) -> RequestSpec:
        if not 0 <= i < len(self.times):
            raise IndexError(i)
        role = int(self._roles[i]) if self._roles is not None else -1
        prefix = self._prefixes[role] if role >= 0 else self._no_prefix
        suffix = LazySuffix(self._stream, i, int(self._suffix_lens[i]))
        session = i if self._sessions else -1
        return request_spec(i, float(self.times[i]), prefix, suffix, int(self._out_lens[i]),
                            int(prefix.size), role, session, 0)

    def __iter__(self):
        return (self[i] for i in range(len(self.times)))

    def in_order(self) -> bool:
        """Whether request order is arrival order, (time, rid) ascending (times never decrease)."""
        t = self.times
        return bool(len(t) < 2 or (np.diff(t) >= 0).all())


def scaled_lengths(lengths: pd.DataFrame, cfg, rows=slice(None)) -> tuple[np.ndarray, np.ndarray]:
    """(prompt suffix, output) token counts of a lengths table's ``rows`` as a workload ``cfg`` scales and caps them:
    at least 1 each, outputs at most ``max_output_len`` when it is set."""
    suffix = np.maximum(1, lengths["num_prefill_tokens"].to_numpy()[rows] * cfg.suffix_scale).astype(np.int64)
    out = np.maximum(1, lengths["num_decode_tokens"].to_numpy()[rows] * cfg.output_scale).astype(np.int64)
    if cfg.max_output_len:
        out = np.minimum(out, cfg.max_output_len)
    return suffix, out


class Workload:
    """Produces the initial arrivals and, for sessions, each follow-up turn."""

    def __init__(self, cfg, seed: int, trace: pd.DataFrame, vocab: int = VOCAB):
        self.cfg = cfg
        self.seed = seed
        self.vocab = min(vocab, VOCAB)  # token ids must exist in the model's vocabulary
        self._trace = trace
        # prompt/output lengths: from the lengths trace when one is given, else from the arrival trace
        self._lengths = load_lengths(cfg.lengths_trace) if getattr(cfg, "lengths_trace", None) else trace
        self._sessions = 0
        rng = rng_for(seed, "prefixes")
        k = cfg.roles if cfg.kind != "azure" else 0
        self.prefixes = [rng.integers(0, self.vocab, cfg.prefix_len, dtype=PROMPT_DTYPE) for _ in range(k)]

    def initial(self) -> list[RequestSpec]:
        return list(self.initial_specs())

    def initial_specs(self) -> InitialSpecs:
        """The initial requests as a sequence whose specs are built when read (``initial()`` builds them
        all): a run holds a few numbers per request, not a spec object, until each one arrives."""
        cfg, tr = self.cfg, self._trace
        n = cfg.num_requests if cfg.num_requests else len(tr)
        lengths = rng_for(self.seed, "lengths")
        if cfg.kind == "azure" or cfg.arrivals == "trace":
            rows = np.arange(min(n, len(tr)))
            times = tr["arrived_at"].to_numpy()[rows] - tr["arrived_at"].iloc[0]
            times = times / cfg.time_scale
        else:
            rows = lengths.integers(0, len(tr), n)
            gaps = rng_for(self.seed, "arrivals").exponential(1.0 / cfg.rate, n)
            times = np.cumsum(gaps) - gaps[0]
        lt, len_rows = tr, rows
        if self._lengths is not tr:  # each request's lengths from a random row of the lengths trace (own stream)
            lt = self._lengths
            len_rows = rng_for(self.seed, "lengths_trace").integers(0, len(lt), len(rows))
        suffix_lens, out_lens = scaled_lengths(lt, cfg, len_rows)
        roles = self._roles(len(rows))
        stream = SuffixStream(rng_for(self.seed, "suffix_tokens"), suffix_lens, self.vocab)
        self._sessions = len(rows)
        return InitialSpecs(np.asarray(times, dtype=np.float64), suffix_lens, out_lens,
                            roles if self.prefixes else None, self.prefixes, stream, cfg.turns > 1)

    def _roles(self, n: int) -> np.ndarray:
        if not self.prefixes:
            return np.full(n, -1)
        rng = rng_for(self.seed, "roles")
        k = len(self.prefixes)
        if self.cfg.role_dist == "zipf":
            with np.errstate(over="ignore"):  # a huge exponent: every role past the first gets weight 0
                p = 1.0 / np.arange(1, k + 1, dtype=np.float64) ** self.cfg.zipf_s
            return rng.choice(k, n, p=p / p.sum())
        return rng.integers(0, k, n)

    def later_turns(self, session: int, turn: int) -> list[tuple[int, int]]:
        """(rid, turn) of the turns after ``turn`` of ``session`` (none for a request without a session), with
        the ids ``follow_up`` gives them."""
        if session < 0:
            return []
        return [(t * self._sessions + session, t) for t in range(turn + 1, self.cfg.turns)]

    def follow_up(self, spec: RequestSpec, outputs: np.ndarray, finish_s: float) -> RequestSpec | None:
        """The session's next turn: previous prompt + its output + a new user message."""
        if spec.session < 0 or spec.turn + 1 >= self.cfg.turns:
            return None
        # one generator per (session, turn): the same follow-up whatever order turns finish in
        rng = rng_for(self.seed, f"followup/{spec.session}/{spec.turn + 1}")
        suffix_len = max(1, int(self._lengths["num_prefill_tokens"].iloc[int(rng.integers(len(self._lengths)))]
                                * self.cfg.suffix_scale * self.cfg.followup_scale))
        out_len = spec.output_len
        if suffix_len > SuffixStream.LONG:  # millions of tokens (rejected on arrival, as a rule): drawn if read
            message = LongMessage(spec.suffix_source, outputs, rng_for(self.seed, f"followup/{spec.session}/"
                                                                                 f"{spec.turn + 1}/message"),
                                  suffix_len, self.vocab)
            suffix = LazySuffix(message, 0, message.size)
        else:
            new = rng.integers(0, self.vocab, suffix_len, dtype=PROMPT_DTYPE)
            suffix = np.concatenate([spec.suffix, np.asarray(outputs).astype(PROMPT_DTYPE), new])
        think = float(rng.exponential(self.cfg.think_time_s)) if self.cfg.think_time_s > 0 else 0.0
        rid = (spec.turn + 1) * self._sessions + spec.session  # independent of completion order (later_turns)
        return RequestSpec(rid, finish_s + think, spec.prefix, suffix, out_len, spec.shared_len,
                           spec.role, spec.session, spec.turn + 1)


class ArrivalQueue:
    """Arrivals not yet delivered, in (time, rid) order; follow-up turns join while running.

    Given :class:`InitialSpecs` in arrival order, it reads them one by one behind a cursor (each
    spec is built when it comes up), merged with the pushed ones by (time, rid)."""

    def __init__(self, specs):
        self._seq = None
        self._next = 0
        self._end = 0  # len(self._seq)
        if isinstance(specs, InitialSpecs) and specs.in_order():
            self._seq, self._heap, self._end = specs, [], len(specs)
        else:
            self._heap = [(s.arrival_s, s.rid, s) for s in specs]
            heapq.heapify(self._heap)

    def push(self, spec: RequestSpec) -> None:
        heapq.heappush(self._heap, (spec.arrival_s, spec.rid, spec))

    def _seq_first(self) -> bool:
        """Whether the sequence's next spec comes before the heap's first."""
        if self._next >= self._end:  # no sequence, or read to its end
            return False
        if not self._heap:
            return True
        return (float(self._seq.times[self._next]), self._next) < self._heap[0][:2]

    def next_time(self) -> float | None:
        if self._seq_first():
            return float(self._seq.times[self._next])
        return self._heap[0][0] if self._heap else None

    def pop(self) -> RequestSpec:
        if self._seq_first():
            self._next += 1
            return self._seq[self._next - 1]
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap) + self._end - self._next
