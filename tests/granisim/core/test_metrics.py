"""The step log and request frame: packed per chunk, the same frames as plain lists of rows."""

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from granisim.core.contract import BatchPlan, PlannedRequest, StepResult
from granisim.core.metrics import BREAKDOWN_KEYS, StepLog, requests_frame
from granisim.core.request import RequestRecord
from tests.granisim.simhelpers import run, small


class ListStepLog:
    """The reference: one Python list per column, appended per plan."""

    def __init__(self):
        self.cols = {k: [] for k in ("step", "start_s", "duration_s", "num_steps", "batch", "prefill_tokens",
                                     "decode_requests", "groups_dense", "groups_cascade", "groups_paged", "copies",
                                     "hit_rate", "evictions")}
        self.pool_cols, self.breakdown = {}, {k: [] for k in BREAKDOWN_KEYS}

    def record(self, start, plan, result, allocator):
        c = self.cols
        paths = [g.path for g in plan.groups]
        for k, v in (("step", plan.step), ("start_s", start), ("duration_s", result.duration_s),
                     ("num_steps", plan.num_steps), ("batch", len(plan.requests)),
                     ("prefill_tokens", sum(r.num_new for r in plan.requests if r.is_prefill)),
                     ("decode_requests", len(plan.requests) - sum(r.is_prefill for r in plan.requests)),
                     ("groups_dense", paths.count("dense")), ("groups_cascade", paths.count("cascade")),
                     ("groups_paged", paths.count("paged")), ("copies", sum(x.length for x in plan.copies)),
                     ("hit_rate", allocator.hit_rate), ("evictions", allocator.evictions)):
            c[k].append(v)
        for name, (used, cached) in allocator.occupancy().items():
            self.pool_cols.setdefault(f"{name}_used", []).append(used)
            self.pool_cols.setdefault(f"{name}_cached", []).append(cached)
        for k in BREAKDOWN_KEYS:
            self.breakdown[k].append(result.breakdown.get(k, 0.0))

    def frame(self):
        df = pd.DataFrame(self.cols)
        for k, v in self.pool_cols.items():
            df[k] = v
        for k, v in self.breakdown.items():
            df[f"t_{k}"] = v
        return df


class Teed:
    """Records every plan of a run into both logs."""

    def __init__(self, chunk):
        self.log, self.ref = StepLog(), ListStepLog()
        self.log.CHUNK = chunk

    def record(self, *a):
        self.log.record(*a)
        self.ref.record(*a)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_step_frame_equals_the_list_of_rows_frame(chunk, monkeypatch):
    """A whole run's step frame, packed every ``chunk`` plans, equals the reference column for column,
    dtypes included. Shown to catch a planted bug: dropping each chunk's last row when packing fails here."""
    import granisim.core.serving_loop as sl

    teed = {}
    monkeypatch.setattr(sl, "StepLog", lambda: teed.setdefault("t", Teed(chunk)))
    run(small(**{"workload.num_requests": 20, "scheduler.fast_forward": False}))
    got, want = teed["t"].log.frame(), teed["t"].ref.frame()
    assert len(got) == len(want) > 50
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_empty_step_frame_has_the_columns():
    df = StepLog().frame()
    assert len(df) == 0 and list(df.columns)[:3] == ["step", "start_s", "duration_s"]


class Alloc:
    """What the step log reads of an allocator: one pool's counts, whatever the plan."""

    hit_rate, evictions = 0.0, 0

    def __init__(self, pools=("cold",)):
        self.pools = pools

    def occupancy(self):
        return {p: (1, 2) for p in self.pools}

    def step_row(self):
        return (self.hit_rate, self.evictions) + sum(self.occupancy().values(), ())


def test_a_pool_appearing_mid_run_is_named():
    plan = BatchPlan(4, "granikv", 1, (PlannedRequest(0, 0, 1, False, -1, 0),), (), ())
    log = StepLog()
    log.record(0.0, plan, StepResult(0.1, {}), Alloc(["cold"]))
    with pytest.raises(ValueError, match=r"step 4: pools \('cold', 'hot'\)"):
        log.record(0.1, plan, StepResult(0.1, {}), Alloc(["cold", "hot"]))


def test_requests_frame_equals_a_frame_of_row_dicts():
    recs = [RequestRecord(2, 0, -1, 0, 1.0, 10, 5, "completed", "", 1.5, 2.0, 3.0, 4, 0, 5),
            RequestRecord(1, 1, 3, 1, 0.5, 12, 1, "rejected", "queue full", finish_s=0.6),
            RequestRecord(0, -1, -1, 0, 0.0, 7, 2, "completed", "", 0.0, 0.25, 0.5, 0, 1, 2)]
    rows = [dict(rid=r.rid, role=r.role, session=r.session, turn=r.turn, status=r.status, reason=r.reason,
                 arrival_s=r.arrival_s, prompt_len=r.prompt_len, output_len=r.output_len, generated=r.generated,
                 cached_tokens=r.cached_tokens, preemptions=r.preemptions, queue_s=r.queue_s, ttft_s=r.ttft_s,
                 tpot_s=r.tpot_s, e2e_s=r.e2e_s, finish_s=r.finish_s) for r in recs]
    want = pd.DataFrame(rows).sort_values("rid", kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(requests_frame(recs), want, check_exact=True)
    assert np.isnan(requests_frame(recs).tpot_s[1])


def test_step_frames_are_independent_and_rows_after_a_frame_are_kept():
    """frame() shares the log's arrays, yet changing one frame changes neither the log nor a later
    frame, and plans recorded after a frame appear in the next one (the framed arrays untouched)."""
    log = StepLog()
    log.CHUNK = 3
    plan = BatchPlan(4, "granikv", 1, (PlannedRequest(0, 0, 1, False, -1, 0),), (), ())
    for i in range(5):
        log.record(float(i), plan, StepResult(0.1, {}), Alloc())
    first = log.frame()
    first.loc[0, "start_s"] = 99.0
    first.insert(0, "replica", 7)
    again = log.frame()
    assert list(again.start_s) == [0.0, 1.0, 2.0, 3.0, 4.0] and "replica" not in again
    for i in range(5, 9):
        log.record(float(i), plan, StepResult(0.1, {}), Alloc())
    later = log.frame()
    assert list(later.start_s) == [float(i) for i in range(9)] and len(log) == 9
    assert list(again.start_s) == [0.0, 1.0, 2.0, 3.0, 4.0] and first.start_s[0] == 99.0


@pytest.mark.parametrize("chunk", [1, 3, 5000])
def test_packed_rows_equal_the_joined_chunks(chunk, monkeypatch):
    """Columns packed every ``chunk`` rows and grown past their first size (and into memory maps)
    equal np.concatenate over np.array of each chunk, dtypes included (an int column that meets a
    float becomes float64); rows read back by index; rows appended after arrays() leave them be."""
    from granisim.core import columns

    rows = [(i, 0 if i < 7000 else 0.5 * i, -i * 1.25) for i in range(9000)]
    monkeypatch.setattr(columns.PackedRows, "START", 16)
    packed = columns.PackedRows(chunk)
    for r in rows:
        packed.append(r)
    got = packed.arrays()
    want = [np.concatenate(parts) for parts in zip(*[[np.array(c) for c in zip(*rows[k : k + chunk])]
                                                      for k in range(0, len(rows), chunk)])]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    assert packed.row(7001) == (7001, 3500.5, -8751.25) and packed.row(3) == (3, 0.0, -3.75)
    packed.append((1, 2.0, 3.0))
    assert len(packed) == 9001 and got[0].size == 9000 and packed.row(9000) == (1, 2.0, 3.0)
    assert packed.arrays()[0][-1] == 1 and got[0][-1] == 8999


@pytest.mark.parametrize("chunk", [1, 7, 1024])
def test_zero_columns_are_left_unwritten_and_read_back_as_written(chunk, monkeypatch):
    """A column whose values are all zero so far is not written (its pages read as zeros), nor copied
    when it grows or after arrays() handed it out; its values, dtype and every other column are as
    np.concatenate over the chunks: -0.0 (not zero bytes) is written, an int zero column that meets a
    float becomes float64, a column turning nonzero keeps its zeros before. Planted bug caught: a
    zero column whose first nonzero chunk was dropped."""
    from granisim.core import columns

    monkeypatch.setattr(columns.PackedRows, "START", 16)
    rows = [(0, 0.0, -0.0 if i == 5000 else 0.0, 0 if i < 3000 else 1.5, False, i) for i in range(6000)]
    packed = columns.PackedRows(chunk)
    for k, r in enumerate(rows):
        packed.append(r)
        if k == 2500:
            early = packed.arrays()  # handed out: later rows go into copies
    got = packed.arrays()
    want = [np.concatenate(parts) for parts in zip(*[[np.array(c) for c in zip(*rows[k : k + chunk])]
                                                      for k in range(0, len(rows), chunk)])]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes()
    assert np.signbit(got[2][5000]) and not np.signbit(got[2][4999])
    assert all(e.size == len(early[-1]) and not e[:-1].any() for e in early[:2]) and early[-1][-1] == 2500
    assert packed.row(5999) == (0, 0.0, 0.0, 1.5, False, 5999) and packed.row(10) == (0, 0.0, 0.0, 0.0, False, 10)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident size from /proc")
def test_a_zero_column_of_a_million_rows_is_not_resident():
    """Packed zeros stay as the memory map's untouched pages: 2 million rows of an int zero column
    (16 MB as written) add far less than that to the resident size, and reading them adds nothing."""
    from granisim.core import columns

    def resident() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    packed = columns.PackedRows(4096)
    before = resident()
    for _ in range(2_000_000):
        packed.append((0,))
    col = packed.arrays()[0]
    assert col.size == 2_000_000 and not col.any()
    assert resident() - before < 4 * 2**20


def test_request_records_read_back_and_frame_like_a_list():
    """RequestRecords gives back the records appended (through append or the scheduler's own
    paths) and the same requests frame as a plain list of them."""
    from granisim.core.request import RequestRecords

    recs = [RequestRecord(2, 0, -1, 0, 1.0, 10, 5, "completed", "", 1.5, 2.0, 3.0, 4, 0, 5),
            RequestRecord(1, 1, 3, 1, 0.5, 12, 1, "rejected", "queue full", finish_s=0.6),
            RequestRecord(0, -1, -1, 0, 0.0, 7, 2, "odd", "", 0.0, 0.25, 0.5, 0, 1, 2)] * 700
    table = RequestRecords(recs)
    assert len(table) == len(recs) and table[-2] == recs[-2]
    assert all(a == b or (a.status == "rejected" and a.rid == b.rid) for a, b in zip(table, recs))
    assert [r.reason for r in table[:3]] == ["", "queue full", ""]
    pd.testing.assert_frame_equal(requests_frame(table), requests_frame(list(table)), check_exact=True)
    _, _, res, reqs = run(small(**{"workload.num_requests": 12}))
    pd.testing.assert_frame_equal(reqs, requests_frame(list(res.records)), check_exact=True)


def test_request_records_iterate_as_indexed():
    """Iterating RequestRecords (the columns read once: packed chunks, then the rows not packed yet)
    gives ``table[i]`` for every i, reasons and statuses included. Planted bug caught: the rows not
    packed yet read before the packed ones."""
    from granisim.core.request import RequestRecords

    recs = [RequestRecord(i, i % 3, -1, 0, 0.5 * i, 10 + i, 5, "completed", "", 1.5, 2.0, 3.0, 4, 0, 5)
            if i % 7 else RequestRecord(i, 1, 3, 1, 0.5, 12, 1, "rejected", f"queue full {i}", finish_s=0.6)
            for i in range(2100)]  # two packed chunks of 1024 and 52 buffered rows
    table = RequestRecords(recs)
    assert repr(list(table)) == repr([table[i] for i in range(len(table))])
    assert [r.reason for r in table if r.reason] == [r.reason for r in recs if r.reason]


def test_joined_records_frame_as_one_table_of_all_their_records():
    """JoinedRecords (a fleet's replicas' tables read as one) gives the records of its parts in order and the
    same requests frame as one RequestRecords of all of them; a fleet's (replica, record) pairs follow it.
    Planted bugs caught: the parts' columns joined in another order; an empty part counted."""
    from granisim.core.request import JoinedRecords, RequestRecords
    from granisim.fleet.loop import FleetRecords

    def rec(rid, status="completed", arrival=1.0):
        return RequestRecord(rid, rid % 3, -1, 0, arrival, 10 + rid, 5, status,
                             "full" if status == "rejected" else "", 1.5, 2.0, 3.0, 4, 0, 5)

    parts = [[rec(5), rec(1, "rejected")], [], [rec(3, arrival=0.5 * k) for k in range(1500)] + [rec(0), rec(5, arrival=9.0)]]
    tables = [RequestRecords(p) for p in parts]
    joined = JoinedRecords(tables)
    flat = [r for p in parts for r in p]
    assert len(joined) == len(flat) and repr(list(joined)) == repr(flat)
    pd.testing.assert_frame_equal(requests_frame(joined), requests_frame(RequestRecords(flat)), check_exact=True)
    fleet = FleetRecords([(-1, tables[0]), (0, tables[1]), (2, tables[2])])
    assert [(i, r.rid) for i, r in fleet] == [(-1, 5), (-1, 1)] + [(2, r.rid) for r in parts[2]]
    assert fleet.replicas().tolist() == [i for i, _ in fleet]
