"""A request's life inside the scheduler, and the frozen record it leaves behind."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from granisim.core.columns import PackedRows
from granisim.core.workload import PROMPT_DTYPE, VOCAB, LazySuffix, RequestSpec
from granisim.lagging import lagging


# (position * 104729) % VOCAB for positions 0 .. 2 * VOCAB - 1 (read-only): stand_in_tokens' windows.
# 104729 is prime to VOCAB, so (position * 104729 + c) % VOCAB = _CYCLE[position + c * _INVERSE % VOCAB]
_CYCLE = np.arange(2 * VOCAB, dtype=np.int64) * 104729 % VOCAB
_CYCLE.flags.writeable = False
_INVERSE = pow(104729, -1, VOCAB)


def stand_in_tokens(rid: int, first: int, n: int) -> np.ndarray:
    """The simulator's stand-in for sampling: output tokens ``first .. first + n`` of request ``rid``
    (deterministic per request and position; int64): ``(rid * 7919 + position * 104729 + 17) % VOCAB``.
    Read-only (a view of one table) when ``first + n <= VOCAB``."""
    if 0 <= first and first + n <= VOCAB:  # the same integers, a window of the table: no array arithmetic
        s = first + (rid * 7919 + 17) % VOCAB * _INVERSE % VOCAB
        return _CYCLE[s : s + n]
    return (rid * 7919 + (np.arange(first, first + n, dtype=np.int64) * 104729) + 17) % VOCAB


def stand_in_token(rid: int, generated: int) -> int:
    """``stand_in_tokens(rid, generated, 1)[0]`` as a Python int."""
    return (rid * 7919 + generated * 104729 + 17) % VOCAB


class DecodeClock:
    """Plain decode steps counted once for many requests: a request on the clock (``Request._clock``)
    has taken one decode step (one token computed, held and generated) per step the clock counted
    since it joined (granisim.core.decode_batch)."""

    __slots__ = ("now",)

    def __init__(self):
        self.now = 0


class Request:
    """Mutable runtime state. ``tokens`` = prompt + outputs so far (``n_tokens`` of them);
    ``computed`` of them have K/V in the cache (the last sampled token is fed in the next
    decode step).

    The token buffer is built on first read of ``tokens`` (admission), not on arrival, so a
    waiting request holds only its suffix. Tokens sampled one at a time (``append_one``, or a
    few at a time by ``append``) are kept in a plain list and written
    into the buffer when ``tokens`` is next read (at the latest when the request finishes):
    a list append instead of an array store per step. Stand-in tokens (``advance``: the
    simulator's synthetic outputs, :func:`stand_in_tokens`) are only counted, and computed
    from their positions when ``tokens`` is next read."""

    __slots__ = ("spec", "rid", "_buf", "_suffix", "_pending", "_n_tokens", "prompt_len", "_computed", "_generated",
                 "admitted_s", "first_token_s", "preemptions", "cached_at_admit", "admit_order", "decoding",
                 "prefix_cached", "group", "output_len", "_flushed", "_clock", "_at")

    def __init__(self, spec: RequestSpec):
        self.spec = spec
        self.rid = spec.rid
        self._suffix = spec.suffix  # drawn now (arrivals come in request order) and held while it runs
        self.prompt_len = spec.prompt_len
        self._buf: np.ndarray | None = None
        # sampled tokens _flushed - len(_pending) .. _flushed, not yet in _buf; then the stand-in tokens
        # _flushed .. n_tokens (the last ones), not yet in _buf either: so a stand-in output only counts
        # n_tokens and generated up
        self._pending: list[int] = []
        self._flushed = self.prompt_len
        self.output_len = spec.output_len
        self._n_tokens = self.prompt_len
        self._computed = 0
        self._generated = 0
        # on a DecodeClock (a decoding request of a scheduler, granisim.core.decode_batch): the counters
        # above lag the clock's steps since ``_at``, each step one more token computed, held and generated
        self._clock: DecodeClock | None = None
        self._at = 0
        self.admitted_s: float | None = None
        self.first_token_s: float | None = None
        self.preemptions = 0
        self.cached_at_admit = 0
        self.admit_order = 0
        self.decoding = False  # all held tokens but the last sampled one have K/V
        self.prefix_cached = False  # its declared shared prefix is in the radix index
        self.group: tuple[int, int, str] | None = None  # the allocator's prefix group, while running

    def _sync(self) -> None:
        """Catch the counters up with the clock (one decode step per clock step since ``_at``)."""
        d = self._clock.now - self._at
        if d:
            self._computed += d
            self._n_tokens += d
            self._generated += d
            self._at += d

    computed = lagging("_computed", "_clock", "_sync")
    n_tokens = lagging("_n_tokens", "_clock", "_sync")
    generated = lagging("_generated", "_clock", "_sync")

    @property
    def tokens(self) -> np.ndarray:
        """The token buffer (int32, as prompts are drawn: prompt + outputs; positions ``n_tokens`` and on are
        unset)."""
        buf = self._buf
        if buf is None:
            buf = self._buf = np.empty(self.prompt_len + self.spec.output_len, dtype=PROMPT_DTYPE)
            p = self.spec.prefix.size
            if p:
                buf[:p] = self.spec.prefix
            buf[p : self.prompt_len] = self._suffix
            self._suffix = buf[p : self.prompt_len]  # the drawn copy goes: the spec's suffix is this part now
            src = self.spec.suffix_source
            if isinstance(src, LazySuffix):
                src.share(self._suffix)
        flushed = self._flushed
        if self._pending:
            pending = self._pending
            buf[flushed - len(pending) : flushed] = pending
            pending.clear()
        synth = self.n_tokens - flushed
        if synth:
            buf[flushed : self.n_tokens] = stand_in_tokens(self.rid, self.generated - synth, synth)
            self._flushed = self.n_tokens
        return buf

    @property
    def remaining_output(self) -> int:
        return self.output_len - self.generated

    def advance(self, n: int) -> None:
        """``n`` more outputs, the stand-in tokens of their positions (:func:`stand_in_tokens`)."""
        self.n_tokens += n
        self.generated += n

    def append_one(self, token: int) -> None:
        if self._flushed != self.n_tokens:
            self.tokens  # stand-ins before this token go into the buffer first
        self._pending.append(token)
        self.n_tokens += 1
        self.generated += 1
        self._flushed += 1

    def append(self, tokens: np.ndarray) -> None:
        n = tokens.size
        if self._flushed != self.n_tokens:
            self.tokens
        if n <= 64:  # a fast-forward block is a few steps: cheaper as list items than as an array store
            self._pending.extend(tokens.tolist())
        else:
            self.tokens[self.n_tokens : self.n_tokens + n] = tokens
        self.n_tokens += n
        self.generated += n
        self._flushed += n


@dataclass(frozen=True, slots=True)
class RequestRecord:
    rid: int
    role: int
    session: int
    turn: int
    arrival_s: float
    prompt_len: int
    output_len: int
    status: str  # 'completed' | 'rejected'
    reason: str = ""
    admitted_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    cached_tokens: int = 0
    preemptions: int = 0
    generated: int = 0

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        return (self.finish_s - self.first_token_s) / (self.output_len - 1) if self.output_len > 1 else float("nan")

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        return self.admitted_s - self.arrival_s


_RECORD_COLS = ("rid", "role", "session", "turn", "prompt_len", "output_len", "cached_tokens", "preemptions",
                "generated", "arrival_s", "admitted_s", "first_token_s", "finish_s")


NOT_SENT = "not sent: "  # the reason of a turn after a rejected one (unsent_turns)


def unsent_turns(records, workload) -> list[RequestRecord]:
    """A rejected turn ends its session: the turns after it are never sent (each prompt would hold the one
    before's output). One rejected record per such turn, so that the records hold every turn of every session:
    prompt length 0 (never formed), the session's output length, arrival and finish at the rejection."""
    if workload.cfg.turns < 2:
        return []
    out = []
    for r in records:
        if r.status != "rejected":
            continue
        for rid, turn in workload.later_turns(r.session, r.turn):
            out.append(RequestRecord(rid, r.role, r.session, turn, r.finish_s, 0, r.output_len, "rejected",
                                     f"{NOT_SENT}turn {r.turn} of its session was rejected", finish_s=r.finish_s))
    return out


class RequestRecords:
    """The finished and rejected requests' records, held as columns (about 100 bytes per request
    instead of a :class:`RequestRecord` and its boxed fields).

    A sequence of :class:`RequestRecord`: ``len``, iteration and indexing build each record from
    its columns. ``columns()`` gives the columns as numpy arrays (no copy) for
    :func:`granisim.core.metrics.requests_frame`."""

    __slots__ = ("_rows", "_statuses", "_reasons", "__weakref__")

    def __init__(self, records=()):
        # the record's fields in _RECORD_COLS order, then its status (an index into _statuses)
        self._rows = PackedRows(dtypes=(None,) * len(_RECORD_COLS) + (np.int8,))
        self._statuses = ["completed", "rejected"]
        self._reasons: dict[int, str] = {}  # row -> reason, where not ""
        for r in records:
            self.append(r)

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, r: RequestRecord) -> None:
        try:
            code = self._statuses.index(r.status)
        except ValueError:
            code = len(self._statuses)
            self._statuses.append(r.status)
        if r.reason:
            self._reasons[len(self._rows)] = r.reason
        self._rows.append((r.rid, r.role, r.session, r.turn, r.prompt_len, r.output_len, r.cached_tokens,
                           r.preemptions, r.generated, r.arrival_s, r.admitted_s, r.first_token_s, r.finish_s, code))

    def add_completed(self, spec: RequestSpec, r: Request, finish_s: float) -> None:
        """``append(RequestRecord(..., "completed", "", r.admitted_s, r.first_token_s, finish_s, ...))``
        of a request that finished, without building the record."""
        self._rows.append((spec.rid, spec.role, spec.session, spec.turn, r.prompt_len, spec.output_len,
                           r.cached_at_admit, r.preemptions, r.generated, spec.arrival_s, r.admitted_s,
                           r.first_token_s, finish_s, 0))

    def add_rejected(self, spec: RequestSpec, finish_s: float, reason: str) -> None:
        """``append(RequestRecord(spec's fields, "rejected", reason, finish_s=finish_s))``."""
        self.append(RequestRecord(spec.rid, spec.role, spec.session, spec.turn, spec.arrival_s, spec.prompt_len,
                                  spec.output_len, "rejected", reason, finish_s=finish_s))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("record index out of range")
        *values, code = self._rows.row(i)
        return RequestRecord(status=self._statuses[code], reason=self._reasons.get(i, ""),
                             **dict(zip(_RECORD_COLS, values)))

    def __iter__(self):
        """``self[i]`` for every i, reading the columns once."""
        statuses, reasons = self._statuses, self._reasons
        for i, (*values, code) in enumerate(self._rows.rows()):
            yield RequestRecord(status=statuses[code], reason=reasons.get(i, ""), **dict(zip(_RECORD_COLS, values)))

    def __repr__(self) -> str:
        return f"RequestRecords({len(self)} records)"

    def columns(self) -> dict[str, np.ndarray]:
        """Every field as an array in record order (views of the columns, never written again; status
        and reason as object arrays of str). Needs a record."""
        *arrays, codes = self._rows.arrays()
        cols = dict(zip(_RECORD_COLS, arrays))
        cols["status"] = np.array(self._statuses, dtype=object)[codes]
        reason = np.full(len(self), "", dtype=object)
        for i, why in self._reasons.items():
            reason[i] = why
        cols["reason"] = reason
        return cols


class JoinedRecords:
    """Several :class:`RequestRecords` read as one, in order: ``len``, iteration (:class:`RequestRecord`)
    and ``columns()`` (each column the parts' columns concatenated), without building a record
    (a fleet's replicas each keep their own)."""

    __slots__ = ("parts",)

    def __init__(self, parts):
        self.parts = [p for p in parts if len(p)]

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __iter__(self):
        for p in self.parts:
            yield from p

    def __repr__(self) -> str:
        return f"JoinedRecords({len(self)} records)"

    def columns(self) -> dict[str, np.ndarray]:
        """As :meth:`RequestRecords.columns` of all the records in one. Needs a record."""
        cols = [p.columns() for p in self.parts]
        if len(cols) == 1:
            return cols[0]
        return {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
