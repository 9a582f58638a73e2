"""A step's work as a :class:`BatchPlan` (a mixin of the Scheduler): decoding requests grouped by
their shared prefix, each group given an attention path (``dense`` / ``cascade`` / ``paged``) by the
policy's dispatch rule, and under ``dispatch = "auto"`` the cheapest of the whole-step alternatives.

Needs the scheduler's ``alloc``, ``G``, ``m_sat``, ``dispatch``, ``path_chooser``, ``step_pricer``,
``needs_layouts`` and ``step_id``.
"""

from __future__ import annotations

from dataclasses import replace

from granisim.core.contract import BatchPlan, PlannedRequest, PrefixGroup


class PlanBuilding:
    def _build_plan(self, work) -> BatchPlan:
        alloc = self.alloc
        members: dict[int, list[int]] = {}
        info: dict[int, tuple[int, str]] = {}
        for i, (r, n, _) in enumerate(work):
            if r.decoding:
                g = r.group
                if g is not None:
                    members.setdefault(g[0], []).append(i)
                    info[g[0]] = (g[1], g[2])
        groups, group_of, private = [], {}, []
        for key, idx in members.items():
            if len(idx) < 2:
                continue  # a lone request gains nothing from a prefix pass
            prefix_len, storage = info[key]
            own = 0
            if self.dispatch == "auto":  # members' own tokens, on average (the chooser weighs re-reading)
                own = sum(work[i][0].computed for i in idx) // len(idx) - prefix_len
            for i in idx:
                group_of[i] = len(groups)
            groups.append(PrefixGroup(key, prefix_len, storage, self._path(prefix_len, len(idx), storage, own),
                                      tuple(idx), len(idx) * self.G))
            private.append(own)
        reqs = []
        for i, (r, n, slots) in enumerate(work):
            g = group_of.get(i, -1)
            shared = groups[g].prefix_len if g >= 0 else 0
            if self.needs_layouts:
                reqs.append(PlannedRequest(r.rid, r.computed, n, not r.decoding, g, shared, slots,
                                           r.tokens[r.computed : r.computed + n].copy(), alloc.layout(r.rid)))
            else:
                reqs.append(PlannedRequest(r.rid, r.computed, n, not r.decoding, g, shared))
        self.step_id += 1
        plan = BatchPlan(self.step_id, alloc.policy, alloc.page_size, tuple(reqs), tuple(groups),
                         tuple(alloc.take_copies()))
        if self.dispatch == "auto" and groups and self.step_pricer is not None:
            plan = self._cheapest_step(plan, private)
        return plan

    def _cheapest_step(self, plan: BatchPlan, private: list[int]) -> BatchPlan:
        """Of the per-group choices, every group without a prefix pass, and every group with its best
        prefix pass, the plan the cost model prices cheapest (ties: the per-group choices)."""
        no_pass = tuple("paged" for _ in plan.groups)
        with_pass = tuple(self._path(g.prefix_len, len(g.members), g.storage, own, allow_paged=False)
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

    def _path(self, prefix_len: int, b: int, storage: str, private: int = 0, allow_paged: bool = True) -> str:
        if self.alloc.policy != "granikv":
            return "paged"
        if self.dispatch == "auto":  # cost model: dense, cascade, or (allow_paged) no prefix pass ('paged')
            path = self.path_chooser(prefix_len, b, storage, private, allow_paged=allow_paged)
            return path if storage == "slab" or path != "dense" else "cascade"
        if self.dispatch == "cost":
            path = self.path_chooser(prefix_len, b, storage)
            return path if storage == "slab" or path != "dense" else "cascade"
        if self.dispatch == "cascade":  # forced: the prefix pass never uses the dense kernel
            return "cascade"
        if self.dispatch == "dense":  # forced: dense wherever the prefix is one slab
            return "dense" if storage == "slab" else "cascade"
        return "dense" if storage == "slab" and b * self.G >= self.m_sat else "cascade"
