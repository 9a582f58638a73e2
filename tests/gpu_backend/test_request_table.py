"""The request table (request_table.py) through the engine's own host path on the CPU: rows.build with a table,
metadata.upload into a CPU arena and the step's on-device append. After every step of real serving runs, each
decoding request's sequence, read through the page table the kernels get, holds exactly its layout's ids (or page
ids) — across HOT compaction copies, preemptions and host-tier transfers, with and without padding.

Each step is also built in full with a second table, and a step derived from the previous one (rows_repeat.py) must
equal it byte for byte.

Planted bugs (tried, seen failing, removed): not resetting the table on a plan that copies KV
(`RequestTable.begin` without `moves_kv`); appending one entry too far (`+ 1` on the append entry); reusing a row
without checking it covers every token but the new ones (`row.tokens` check dropped); never freeing the rows of
requests that left (`RequestTable.finish`); in rows_repeat, lengths not advanced, a step with copies taken as a
repeat, rows' token counts not advanced, a row extended past its block, the token counts not written back to the
rows when the steps stop repeating (`Repeat.release`), the bucketed lengths' raw values not advanced."""

import numpy as np
import pytest
import torch

from gpu_backend.bench.host_work import engine_plans
from gpu_backend.executor import metadata, rows as R
from gpu_backend.executor.arena import MetaArena
from gpu_backend.executor.request_table import RequestTable
from granisim.config.scenario import parse_scenario
from granisim.core.contract import StepResult
from granisim.core.serving_loop import ServingLoop
from granisim.experiments.run import prepare

BASE = {
    "name": "table", "seed": 7, "model": {"name": "tiny"},
    "scheduler": {"max_batch_tokens": 256, "fast_forward": False},
    "workload": {"kind": "multi_agent", "roles": 5, "prefix_len": 64, "num_requests": 90, "rate": 400.0,
                 "suffix_scale": 0.03, "max_output_len": 24},
}
CASES = {  # name: (changes, what the run must have exercised)
    "granikv, compaction": ({"policy.name": "granikv", "policy.hot_fraction": 0.35, "policy.m_sat": 10**6,
                             "workload.roles": 9, "hardware.kv_budget_tokens": 1500}, "copies"),
    "granikv, dense and cascade": ({"policy.name": "granikv", "policy.hot_fraction": 0.4, "policy.m_sat": 24,
                                    "hardware.kv_budget_tokens": 6000}, "grouped"),
    "token, preemption": ({"policy.name": "token", "workload.roles": 9, "hardware.kv_budget_tokens": 500},
                          "preempted"),
    "paged16, preemption": ({"policy.name": "paged16", "workload.roles": 9, "hardware.kv_budget_tokens": 700},
                            "preempted"),
    "token, long outputs": ({"policy.name": "token", "workload.num_requests": 24, "workload.max_output_len": 400,
                             "hardware.kv_budget_tokens": 12000}, "outgrown"),
    "token, host tier": ({"policy.name": "token", "hardware.kv_budget_tokens": 700, "hardware.host_kv_gb": 1e-3,
                          "policy.host_tier": "slabs+pages"}, "transfers"),
    "granikv, host tier": ({"policy.name": "granikv", "policy.hot_fraction": 0.3, "hardware.kv_budget_tokens": 900,
                            "hardware.host_kv_gb": 1e-3, "policy.host_tier": "slabs"}, "transfers"),
}


def _expected(layout, start: int, kv_len: int, page: int) -> np.ndarray:
    ids = layout.slots()[start:kv_len]
    return ids if page == 1 else ids[::page] // page


class TableCheck:
    """The engine's protocol: each plan through rows.build with the table, uploaded into a CPU arena, the appends
    applied; then every decoding request's sequence checked against its layout."""

    needs_layouts = True
    max_steps_per_plan = 1

    def __init__(self, num_slots: int, pad: bool, compact_every: int = 0):
        self.num_slots, self.pad, self.compact_every = num_slots, pad, compact_every
        self.allocator = None  # set once the serving loop is built
        self.table = RequestTable()
        self.full = RequestTable()  # the same plans built in full every step (no step derived from the previous one)
        self.arena = MetaArena(torch.device("cpu"))
        self.seen = {"copies": 0, "grouped": 0, "preempted": 0, "pages": 0, "transfers": 0, "checked": 0,
                     "repeated": 0, "outgrown": 0}
        self.bases: dict[int, int] = {}  # rid -> its row's base in the last step
        self.last: set[int] = set()
        self.gone: set[int] = set()  # requests that decoded, then left a step (finished or preempted)

    def execute(self, plan):
        host = R.build(plan, self.num_slots, pad=self.pad, table=self.table)
        full = R.build(plan, self.num_slots, pad=self.pad, table=self.full)
        self.full.repeat = None
        self.seen["repeated"] += self.table.repeat is not None and self.table.repeat.host is host
        _same(host, full)
        if not self.arena.fits(host):
            self.arena.reserve(host)
        m = metadata.upload(host, self.arena)
        now = {r.rid for r in plan.requests if not r.is_prefill}
        if host.shape.table:
            metadata.append_new_tokens(m)
            self._check(plan, host, m, now)
        back = self.gone & {r.rid for r in plan.requests}
        self.seen["preempted"] += len(back)
        self.gone = (self.gone - back) | (self.last - now)
        self.last = now
        if self.compact_every and plan.step % self.compact_every == 0:
            # what the allocator does to make room for a slab: evict the LRU unlocked HOT prefix, then slide the
            # slabs above its hole down (the copies go with the next plan, and the moved prefixes' ids change)
            self.allocator.eviction.evict_lru_hot_leaf()
            self.allocator.compact()
        return StepResult(1e-3, {}, {r.rid: 1 for r in plan.requests})

    def _check(self, plan, host, m, now):
        s, page = host.shape, m.table_page
        table = m.table.numpy()
        moved = bool(plan.copies or plan.transfers)
        for r in plan.requests:
            if r.is_prefill:
                continue
            i = host.sample_of[r.rid] - s.ext_reqs
            if i < s.dec_rows:
                kv, seq, start = m.decode_kv, i, 0
            else:
                kv, seq, start = m.suffix_kv, i - s.dec_rows, plan.groups[r.group].prefix_len
                self.seen["grouped"] += 1
            assert isinstance(kv, metadata.L.PageTable) and kv.page_size == page
            base, n = int(kv.indptr[seq]), int(kv.lens[seq])
            self.seen["outgrown"] += not moved and self.bases.get(r.rid, base) != base  # moved to a larger block
            self.bases[r.rid] = base
            assert n == r.kv_len - start
            got = table[base: base + -(-n // page)]
            assert np.array_equal(got, _expected(r.layout, start, r.kv_len, page)), (plan.step, r.rid)
            self.seen["checked"] += 1
            self.seen["pages"] += page > 1
            self.seen["copies"] += bool(plan.copies) and r.rid in self.last
            self.seen["transfers"] += bool(plan.transfers) and r.rid in self.last


def _same(a: R.HostStep, b: R.HostStep) -> None:
    """Byte for byte the same step metadata."""
    assert a.shape == b.shape and a.sample_of == b.sample_of and a.table_entries == b.table_entries
    assert len(a.small) == len(b.small) and all(np.array_equal(x, y) and x.dtype == y.dtype
                                                for x, y in zip(a.small, b.small))
    assert a.big.keys() == b.big.keys() and all(np.array_equal(a.big[k], b.big[k]) for k in a.big)


def _serve(changes: dict, pad: bool, compact_every: int = 0) -> TableCheck:
    setup = prepare(parse_scenario(BASE).with_changes(**changes))
    check = TableCheck(setup.kv_budget, pad, compact_every)
    loop = ServingLoop(setup, check, progress=False)
    check.allocator = loop.allocator
    res = loop.run()
    assert all(r.status == "completed" for r in res.records)
    return check


@pytest.mark.parametrize("pad", [True, False], ids=["padded", "exact"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_decoding_request_reads_its_own_ids_through_the_table(case, pad):
    changes, exercised = CASES[case]
    check = _serve(changes, pad, compact_every=4 if exercised == "copies" else 0)
    assert check.seen["checked"] > 200, check.seen
    assert check.seen[exercised] > 0, f"the run never had {exercised}: the test would prove nothing ({check.seen})"
    assert check.table.patched < check.seen["checked"] * 64  # rows are reused, not written afresh each step
    assert check.seen["repeated"] > 0, check.seen  # steps derived from the previous one (rows_repeat.py)


def test_rows_are_reused_while_decoding_and_freed_after():
    t = RequestTable()
    t.begin(1, False)
    assert t.locate(7, 0, 100, 100) == (1, True)  # first seen: written whole
    t.finish()
    t.begin(1, False)
    assert t.locate(7, 0, 101, 1) == (1, False)  # one more token: appended
    t.finish()
    t.begin(1, False)
    base, whole = t.locate(7, 0, 103, 1)  # a token went missing (not the previous step's + 1): written again
    assert whole
    t.finish()
    t.begin(1, True)  # a plan that moves KV: every row is written again
    assert t.locate(7, 0, 104, 1)[1]
    t.finish()
    t.begin(1, False)
    t.finish()  # request 7 absent: its block is freed and handed to the next request of its size
    t.begin(1, False)
    assert t.locate(8, 0, 100, 100) == (1, True)
    assert t.locate(9, 0, 300, 300) == (257, True)  # after it a block of 1,024 entries: room to double
    assert t.end == 257 + 1024



def test_the_table_starts_afresh_before_freed_blocks_pile_up():
    """Blocks are reused by size only: requests of ever larger contexts, one at a time, leave every earlier block
    free and of no use to the small requests that follow. The table starts afresh once it spans four times what its
    rows hold (past `SPARE`). Planted bug (tried,
    seen failing, removed): without that rule in `begin` it keeps the 4M entries of the large requests."""
    from gpu_backend.executor.request_table import SPARE

    t = RequestTable()
    sizes = [4000 * (k + 1) for k in range(60)] + [500] * 20  # growing, then small
    for rid, n in enumerate(sizes):
        t.begin(1, False)
        assert t.end <= 4 * t.held + SPARE, (rid, t.end, t.held)
        assert t.locate(rid, 0, n, n)[1]
        t.finish()
    assert t.resets > 0 and t.end < SPARE  # the small requests' blocks alone


def _outcome(table: RequestTable, before, plan, num_slots: int, pad: bool, repeat: bool):
    """`plan` built with a table that built `before` just now (and, unless `repeat`, forgot what a repeat reads):
    ('ok', HostStep) or ('error', message)."""
    R.build(before, num_slots, pad=True, table=table)
    if not repeat:
        table.repeat = None
    try:
        return ("ok", R.build(plan, num_slots, pad=pad, table=table))
    except ValueError as e:
        return ("error", str(e))


def _requests(plan, k: int, **changes):
    """`plan`'s requests with request k's fields changed."""
    from dataclasses import replace

    reqs = list(plan.requests)
    reqs[k] = replace(reqs[k], **changes)
    return tuple(reqs)


def test_a_step_that_does_not_repeat_the_previous_one_is_built_in_full():
    """A real repeating decode step (grouped and ungrouped requests), broken in each way `Repeat.next` checks for:
    built after the step it would repeat, it is what the full build makes of it (the same fields, or the same
    ValueError). Planted bugs caught, each alone (seen failing, removed): no range check of the new slots, no
    check of the layouts' lengths, of `is_prefill`, of `num_new`, of `context_len`, of the requests' ids, of the
    groups, of `pad`, of the plan's copies."""
    from dataclasses import replace

    from granisim.core.contract import KVCopy

    all_plans, num_slots = engine_plans(parse_scenario(BASE).with_changes(**CASES["granikv, dense and cascade"][0]))
    pairs = []  # (step, the next step), the next one derived from the step (rows_repeat.py)
    table = RequestTable()
    for before, plan in zip(all_plans, all_plans[1:]):
        R.build(before, num_slots, pad=True, table=table)
        host = R.build(plan, num_slots, pad=True, table=table)
        if table.repeat is not None and table.repeat.host is host and plan.groups and any(
                r.group == -1 for r in plan.requests):
            pairs.append((before, plan))
        table = RequestTable()
    assert pairs
    before, plan = pairs[len(pairs) // 2]
    k = next(i for i, r in enumerate(plan.requests) if r.group == -1)  # an ungrouped request (a decode row)
    r = plan.requests[k]
    other = next(q for q in plan.requests if q.layout.num_tokens != r.layout.num_tokens)
    broken = {
        "slot past the buffer": _requests(plan, k, new_slots=np.array([num_slots])),
        "negative slot": _requests(plan, k, new_slots=np.array([-1])),
        "two slots": _requests(plan, k, new_slots=np.array([1, 2])),
        "no input token": _requests(plan, k, input_tokens=np.zeros(0, np.int32)),
        "layout of another length": _requests(plan, k, layout=other.layout),
        "no layout": _requests(plan, k, layout=None),
        "prefill": _requests(plan, k, is_prefill=True),
        "two new tokens": _requests(plan, k, num_new=2),  # the full build raises: a layout one token short
        "a token further": _requests(plan, k, context_len=r.context_len + 1),  # the same
        "another request": _requests(plan, k, rid=10 ** 6),
    }
    plans = {name: replace(plan, requests=reqs) for name, reqs in broken.items()}
    plans["no groups"] = replace(plan, groups=(), requests=tuple(replace(q, group=-1) for q in plan.requests))
    plans["a KV copy"] = replace(plan, copies=(KVCopy(0, 0, 0),))
    table = RequestTable()
    assert _outcome(table, before, plan, num_slots, True, repeat=True)[1] is table.repeat.host  # as it is: a repeat
    for name, p in [("as it is", plan), *plans.items(), ("exact", plan)]:
        pad = name != "exact"
        got = _outcome(RequestTable(), before, p, num_slots, pad, repeat=True)
        want = _outcome(RequestTable(), before, p, num_slots, pad, repeat=False)
        assert got[0] == want[0], (name, got, want)
        if got[0] == "error":
            assert got == want, name
        else:
            _same(got[1], want[1])
