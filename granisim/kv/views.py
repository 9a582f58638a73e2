"""The read side of :class:`granisim.kv.allocator.KVAllocator`: layouts and reports.

:class:`AllocatorViews` never allocates or frees a slot: per-request layouts and prefix
groups for the batch planner, and ownership / occupancy / stats for the fuzzer, the logs
and the reports. The allocator builds it from what it reads — the table of live requests,
the private store, the HOT pool (``granikv`` only), the radix index and the counters —
and forwards its public methods to it. :func:`prefix_group_of` is the rule that tells
which prefix group a request belongs to; the allocator stores the answer on the request.
"""

from __future__ import annotations

import numpy as np

from granisim.kv.counters import AllocatorCounters
from granisim.kv.hot_pool import HotPool
from granisim.kv.layout import AllocatorStats, KVSegment, PoolStats, RequestLayout
from granisim.kv.protocol import CachedRun
from granisim.kv.radix import RadixIndex, path_to
from granisim.kv.sequence import Requests, _is_run, _Seq


def prefix_group_of(seq: _Seq, page_size: int) -> tuple[int, int, str] | None:
    """(group node id, shared tokens, storage 'slab' | pool name) once ``seq``'s declared
    shared prefix (floored to whole pages) is cached on its path and ends at a node boundary."""
    shared = seq.shared_len - seq.shared_len % page_size
    if shared <= 0 or seq.cached_len < shared:
        return None
    depth, path = 0, []
    for node in path_to(seq.node):
        depth += len(node)
        path.append(node)
        if depth >= shared:
            break
    if depth != shared:
        return None
    slab = all(n.pool == "hot" for n in path) and _path_is_run(path)
    return (path[-1].id, shared, "slab" if slab else path[-1].pool)


def _path_is_run(path: list) -> bool:
    """``_is_run`` of the path's slots concatenated: every node's slots a run (cached on the node) and
    each node's first slot one past the previous node's last."""
    last = None
    for n in path:
        v = n.value
        if not v.size:
            continue
        run = n.run
        if run is None or run[0] is not v:
            run = n.run = (v, _is_run(v))
        if not run[1] or (last is not None and int(v[0]) != last + 1):
            return False
        last = int(v[-1])
    return last is not None


class AllocatorViews:
    def __init__(self, policy: str, requests: Requests, store, hot: HotPool | None, radix: RadixIndex,
                 counters: AllocatorCounters):
        self.policy = policy
        self.requests = requests
        self.store = store
        self.hot = hot
        self.radix = radix
        self.counters = counters
        self.page_size = store.page_size

    # ---- layouts --------------------------------------------------------------------------
    def layout(self, rid: int) -> RequestLayout:
        seq = self.requests.get(rid)
        segs: list[KVSegment] = []
        for node in path_to(seq.node):
            self._append(segs, node.pool, node.value)
        if seq.slab is not None and seq.n_new:
            s0, _ = self.hot.span(seq.slab)
            filled = min(seq.n_new, seq.slab_len)
            self._append(segs, "hot", np.arange(s0, s0 + filled, dtype=np.int64))
        if seq.n_priv:
            self._append(segs, self.store.name, seq.priv[: seq.n_priv])
        group, shared = (seq.group[0], seq.group[1]) if seq.group else (None, 0)
        return RequestLayout(rid, tuple(segs), seq.num_tokens, shared, group)

    @staticmethod
    def _append(segs: list[KVSegment], pool: str, slots: np.ndarray) -> None:
        if segs and segs[-1].pool == pool:
            slots = np.concatenate([segs[-1].slots, slots])
            segs.pop()
        contiguous = pool == "hot" and _is_run(slots)
        segs.append(KVSegment(pool, slots, (int(slots[0]), int(slots.size)) if contiguous else None))

    def prefix_group(self, rid: int) -> tuple[int, int, str] | None:
        """(group node id, shared tokens, storage 'slab' | pool name) or None."""
        return self.requests.get(rid).group

    def num_tokens(self, rid: int) -> int:
        return self.requests.get(rid).num_tokens

    # ---- reports --------------------------------------------------------------------------
    def live_requests(self) -> list[int]:
        return self.requests.ids()

    def ownership(self) -> list[tuple[str, int, str, np.ndarray]]:
        """(owner kind 'request' | 'node', owner id, pool, slots) for every owned slot run."""
        out = []
        for seq in self.requests:
            if seq.slab is not None:
                s0, ln = self.hot.span(seq.slab)
                out.append(("request", seq.rid, "hot", np.arange(s0, s0 + ln, dtype=np.int64)))
            if seq.priv.size:
                out.append(("request", seq.rid, self.store.name, seq.priv))
        for node in self.radix.nodes():
            out.append(("node", node.id, node.pool, node.value))
        return out

    def cached_runs(self) -> list[CachedRun]:
        """Every radix node as a :class:`granisim.kv.protocol.CachedRun` (for the fuzzer)."""
        root = self.radix.root
        return [CachedRun(n.id, 0 if n.parent is root else n.parent.id, n.key, n.value, n.pool, n.lock_ref > 0)
                for n in self.radix.nodes()]

    def free_slots(self) -> dict[str, np.ndarray]:
        """Free slot ids per pool (for the fuzzer)."""
        out = {}
        for name, pool in self.pools().items():
            start, _ = self.pool_bounds()[name]
            out[name] = np.flatnonzero(pool.free_mask()).astype(np.int64) + start
        return out

    def pool_bounds(self) -> dict[str, tuple[int, int]]:
        """Slot range ``[start, stop)`` of every pool."""
        return {name: (pool.pool.slot_start if hasattr(pool, "pool") else pool.slot_start,
                       (pool.pool.slot_start if hasattr(pool, "pool") else pool.slot_start) + pool.capacity)
                for name, pool in self.pools().items()}

    def pools(self) -> dict[str, object]:
        out = {self.store.name: self.store}
        if self.hot is not None:
            out["hot"] = self.hot
        return out

    def occupancy(self) -> dict[str, tuple[int, int]]:
        """(used, cached) tokens per pool — the cheap part of :meth:`stats`, for per-step logs."""
        out = {}
        for name, pool in self.pools().items():
            cached = self.radix.evictable.get(name, 0)
            out[name] = (pool.capacity - pool.free - cached, cached)
        return out

    def step_row(self) -> tuple:
        """(hit rate, evictions, then used and cached tokens of each pool in ``occupancy`` order): what the
        step log records after every plan, without the dicts."""
        radix_cached, store, n = self.radix.evictable, self.store, self.counters
        cached = radix_cached.get(store.name, 0)
        pool = store.pool  # its capacity and free count, read past the store's properties
        row = (n.hit_tokens / n.lookup_tokens if n.lookup_tokens else 0.0, n.evictions,
               pool.capacity - pool.free - cached, cached)
        hot = self.hot
        if hot is None:
            return row
        cached = radix_cached.get("hot", 0)
        return row + (hot.capacity - hot.free - cached, cached)

    def hit_rate(self) -> float:
        n = self.counters
        return n.hit_tokens / n.lookup_tokens if n.lookup_tokens else 0.0

    def stats(self) -> AllocatorStats:
        pools, objs = {}, self.pools()
        for name, (used, cached) in self.occupancy().items():
            pool = objs[name]
            free = pool.free
            if name == "hot":
                frag = pool.external_fragmentation()
            elif self.page_size > 1:
                spare = sum(s.priv.size - s.n_priv for s in self.requests)
                frag = spare / used if used else 0.0
            else:
                frag = 0.0
            pools[name] = PoolStats(pool.capacity, free, used, cached, frag)
        hot = self.hot
        return AllocatorStats(
            policy=self.policy, pools=pools,
            compactions=hot.compactions if hot else 0, copied_tokens=hot.copied_tokens if hot else 0,
            **self.counters.as_dict(),
        )
