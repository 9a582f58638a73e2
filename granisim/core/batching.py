"""A step's work as a :class:`BatchPlan`: the batch builder the scheduler holds.

Decoding requests are grouped by their shared prefix (the allocator's prefix group), each group of
two or more gets an attention path (``dense`` / ``cascade`` / ``paged``) from the dispatch rule
:func:`choose_path`, and under ``dispatch = "auto"`` the cheapest of the whole-step alternatives is
kept. ``m_sat`` takes effect in :func:`choose_path`'s threshold rule: dense when the group's
``M_eff = members * group_size`` reaches it and the prefix is one HOT slab.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain, repeat
from dataclasses import dataclass, replace

import numpy as np

from granisim.core.contract import BatchPlan, PlannedRequest, batch_plan, prefix_group
from granisim.core.planned import DecodeContexts, PlannedRequests, group_columns

# (prefix_len, group requests, storage[, private_len, allow_paged=]) -> 'dense' | 'cascade' | 'paged'
PathChooser = Callable[..., str]
# a plan -> its predicted seconds (dispatch = "auto" compares whole steps)
StepPricer = Callable[[BatchPlan], float]


def choose_path(policy: str, dispatch: str, prefix_len: int, b: int, storage: str, *, group_size: int,
                m_sat: int, path_chooser: PathChooser | None = None, private: int = 0,
                allow_paged: bool = True) -> str:
    """The attention path of a prefix group of ``b`` decoding requests (pure).

    Only ``granikv`` has prefix passes (else ``paged``). ``cost`` / ``auto`` ask the cost model
    (``path_chooser``); ``cascade`` / ``dense`` force a kind; ``threshold`` (the default) takes
    dense when ``b * group_size >= m_sat`` and the prefix is one slab. Dense needs a slab: a
    dense answer on other storage becomes cascade.
    """
    if policy != "granikv":
        return "paged"
    if dispatch == "auto":  # cost model: dense, cascade, or (allow_paged) no prefix pass ('paged')
        path = path_chooser(prefix_len, b, storage, private, allow_paged=allow_paged)
        return path if storage == "slab" or path != "dense" else "cascade"
    if dispatch == "cost":
        path = path_chooser(prefix_len, b, storage)
        return path if storage == "slab" or path != "dense" else "cascade"
    if dispatch == "cascade":  # forced: the prefix pass never uses the dense kernel
        return "cascade"
    if dispatch == "dense":  # forced: dense wherever the prefix is one slab
        return "dense" if storage == "slab" else "cascade"
    return "dense" if storage == "slab" and b * group_size >= m_sat else "cascade"


@dataclass
class BatchBuilder:
    """Turns a step's work list into a frozen :class:`BatchPlan`."""

    policy: str
    group_size: int
    m_sat: int
    dispatch: str = "threshold"
    path_chooser: PathChooser | None = None
    step_pricer: StepPricer | None = None
    needs_layouts: bool = False

    def __post_init__(self):
        if self.dispatch in ("cost", "auto") and self.path_chooser is None:
            raise ValueError(f"dispatch = {self.dispatch!r} needs a path_chooser (the cost model)")
        # n -> ([1] * n, [False] * n): the decode rows' num_new and is_prefill columns, shared by every plan
        # with n decode rows and nothing else (plans' columns are never written)
        self._decode_cols: dict[int, tuple[list[int], list[bool]]] = {}

    def path(self, prefix_len: int, b: int, storage: str, private: int = 0, allow_paged: bool = True) -> str:
        return choose_path(self.policy, self.dispatch, prefix_len, b, storage, group_size=self.group_size,
                           m_sat=self.m_sat, path_chooser=self.path_chooser, private=private,
                           allow_paged=allow_paged)

    def build(self, work, alloc, step_id: int, *, decode: list | None = None, rids: list | None = None,
              ctx: DecodeContexts | None = None, decode_slots: list | None = None,
              any_group: bool = True) -> BatchPlan:
        """``work``: (request, new tokens, their slots) per request, in scheduling order. With ``decode``:
        the plan's first rows are these decoding requests (one new token each; their ``rids``, their
        contexts ``ctx`` when known, their slots ``decode_slots`` when the executor needs layouts) and
        ``work`` holds the rows after them, none decoding (the scheduler's order); ``any_group=False``
        says that none of them has a prefix group."""
        n_rows = len(work) + (len(decode) if decode is not None else 0)
        sums = None  # group node id -> (rows, context sum, longest context), when the batch kept them
        if decode is None:
            first = [w[0] for w in work]  # the row's request, by row index (the rows that may group)
            members = _members((i, r.group) for i, r in enumerate(first) if r.decoding)
        else:
            first = decode
            if not any_group:
                members = {}
            elif ctx is not None and ctx.groups is not None:
                members, sums = _members_of(*ctx.groups)
            else:
                members = _members(enumerate([r.group for r in decode]))
        groups, private, group_rows = [], [], []
        for key, idx in members.items():
            if len(idx) < 2:
                continue  # a lone request gains nothing from a prefix pass
            _, prefix_len, storage = first[idx[-1]].group  # as the last member sees it
            own = 0
            if self.dispatch == "auto":  # members' own tokens, on average (the chooser weighs re-reading)
                total = sums[key][1] if sums is not None else sum(first[i].computed for i in idx)
                own = total // len(idx) - prefix_len
            idx = tuple(idx)
            group_rows.append((idx, prefix_len))
            groups.append(prefix_group(key, prefix_len, storage, self.path(prefix_len, len(idx), storage, own),
                                       idx, len(idx) * self.group_size))
            private.append(own)
        if self.needs_layouts:
            group_of, shared_of = group_columns(n_rows, group_rows)
            rows = work if decode is None else chain(zip(decode, repeat(1), decode_slots), work)
            reqs = tuple(PlannedRequest(r.rid, r.computed, n, not r.decoding, g, sh, slots,
                                        r.tokens[r.computed : r.computed + n].copy(), alloc.layout(r.rid))
                         for (r, n, slots), g, sh in zip(rows, group_of, shared_of))
        elif decode is None:  # columns, no PlannedRequest object per request per plan (built when read)
            rs = [w[0] for w in work]
            reqs = PlannedRequests([r.rid for r in rs], [r.computed for r in rs], [w[1] for w in work],
                                   [not r.decoding for r in rs], *group_columns(n_rows, group_rows))
        else:  # decode rows: known ids, one token each, not prefill; the rest are prefill rows; the group
            # and shared-prefix columns are built when read
            nd = len(decode)
            if ctx is None and nd:
                c = [r.computed for r in decode]
                ctx = DecodeContexts(c, 0, sum(c), max(c))
            if work:
                later = [w[0].computed for w in work]
                reqs = PlannedRequests(rids + [w[0].rid for w in work], later, [1] * nd + [w[1] for w in work],
                                       [False] * nd + [True] * len(work), None, None, n_decode=nd,
                                       decode_contexts=ctx, group_rows=group_rows)
            else:
                cols = self._decode_cols.get(nd)
                if cols is None:
                    cols = self._decode_cols[nd] = ([1] * nd, [False] * nd)
                reqs = PlannedRequests(rids, [], cols[0], cols[1], None, None, n_decode=nd,
                                       decode_contexts=ctx, group_rows=group_rows)
        plan = batch_plan(step_id, alloc.policy, alloc.page_size, reqs, tuple(groups), tuple(alloc.take_copies()),
                          transfers=tuple(alloc.take_transfers()))
        if self.dispatch == "auto" and groups and self.step_pricer is not None:
            plan = self._cheapest_step(plan, private)
        return plan

    def _cheapest_step(self, plan: BatchPlan, private: list[int]) -> BatchPlan:
        """Of the per-group choices, every group without a prefix pass, and every group with its best
        prefix pass, the plan the cost model prices cheapest (ties: the per-group choices)."""
        no_pass = tuple("paged" for _ in plan.groups)
        with_pass = tuple(self.path(g.prefix_len, len(g.members), g.storage, own, allow_paged=False)
                          for g, own in zip(plan.groups, private))
        chosen = tuple(g.path for g in plan.groups)
        others = [paths for paths in dict.fromkeys((no_pass, with_pass)) if paths != chosen]
        if not others:
            return plan
        best, best_s = plan, self.step_pricer(plan)
        for paths in others:
            alt = replace(plan, groups=tuple(replace(g, path=p) for g, p in zip(plan.groups, paths)))
            s = self.step_pricer(alt)
            if s < best_s:
                best, best_s = alt, s
        return best


def _members(grouped) -> dict[int, list[int]]:
    """group node id -> the row indices of its members, in order of first appearance, from (row, the
    request's group or None) pairs."""
    members: dict[int, list[int]] = {}
    for i, g in grouped:
        if g is not None:
            idx = members.get(g[0])
            if idx is None:
                members[g[0]] = [i]
            else:
                idx.append(i)
    return members


def _members_of(row_groups: np.ndarray, sums: dict) -> tuple[dict[int, list[int]], dict]:
    """``_members`` of the groups with two members or more, from each row's group node id (-1: none) and
    the groups' kept sums (granisim.core.decode_batch): the rows sorted by group once (stably: each group's
    rows in order), each group the run of its kept member count."""
    a = np.asarray(row_groups)
    order = np.argsort(a, kind="stable").tolist()
    found, pos = [], 0
    for k in sorted(sums):  # the groups in the sorted rows' order
        end = pos + sums[k][0]
        if not pos < end <= len(order) or a.item(order[pos]) != k or a.item(order[end - 1]) != k:
            return _members_compared(a, sums), sums  # the sums are not these rows' (not the batch's)
        if k >= 0 and end - pos >= 2:
            found.append(order[pos:end])
        pos = end
    if pos != len(order):
        return _members_compared(a, sums), sums
    found.sort()  # by first row: the order of first appearance
    return {a.item(rows[0]): rows for rows in found}, sums


def _members_compared(a: np.ndarray, sums: dict) -> dict[int, list[int]]:
    """``_members_of``'s groups, one array comparison a group."""
    found = sorted((int(p[0]), k, p) for k in sums if k >= 0 and sums[k][0] >= 2 for p in (np.flatnonzero(a == k),))
    return {k: p.tolist() for _, k, p in found}
