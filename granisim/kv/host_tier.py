"""A host-memory tier for KV: evicted prefixes go to host memory and come back by copy.

Off by default (``[hardware] host_kv_gb = 0``): the allocator then has no ``HostTier`` and
runs exactly the code it runs without one. With a tier:

* **Write-back** (:meth:`HostTier.write_back`). When the GPU radix index evicts a node, its
  token path (root to node) is offered to the host. ``policy.host_tier = "slabs"`` keeps only
  HOT slab nodes (``granikv``); ``"slabs+pages"`` keeps every evicted node (COLD prefix pages
  too, and all of ``token`` / ``paged``, which move pages as SGLang's HiCache does). The part
  of the path the host does not hold yet is copied: one contiguous copy when it lies in one
  HOT slab, else one gather per page.
  ``policy.host_write = "reused"`` writes back only runs that a request has matched since they
  were cached (``RadixNode.hits``), as SGLang's ``write_through_selective`` writes only runs hit
  often enough: a finished request's own tokens that nobody read again are dropped, not copied.
* **Prefetch** (:meth:`HostTier.match`): at admission, a prompt whose prefix the host holds
  beyond the GPU match is copied back instead of recomputed; the allocator inserts the
  copied run into the GPU radix index at once (the node is restored, matchable by others).
  The host copy stays (KV is immutable): a later eviction of the same run moves nothing.
* **Host eviction**: when host memory runs short, ``"lru"`` drops the least recently used
  host leaf; ``"next_use"`` drops the leaf whose role is expected back last (each role's
  mean gap between admissions, in admissions; in the spirit of KVFlow).

Every copy is a frozen :class:`KVTransfer` queued for the executor (the plan's
``transfers``); executors apply ``to_host`` copies before the step (the GPU slots may be
reused by it) and ``to_gpu`` copies before the layers that read them.

Which tier a token run is on: the GPU radix index holds GPU slots only; this module's own
:class:`granisim.kv.radix.RadixIndex` holds host slot ids (a separate id space, its own
pool). A node of the host index is never in a plan's layouts or groups. Integers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from granisim.kv.cold_pool import ColdPool
from granisim.kv.radix import TOKEN_DTYPE, RadixIndex, RadixNode, path_to
from granisim.kv.sequence import path_slots, run_starts

__all__ = ["HOST_MODES", "HOST_EVICTIONS", "HOST_WRITES", "MAX_HOST_TOKENS", "HostTierConfig", "HostTier",
           "KVTransfer", "host_tier_config"]

HOST_MODES = ("slabs", "slabs+pages")
HOST_EVICTIONS = ("lru", "next_use")
HOST_WRITES = ("all", "reused")  # which evicted runs are written back
ROLE_KEY_TOKENS = 16  # a prefix's first tokens name its role for next_use (declared prefixes are distinct)


@dataclass(frozen=True, slots=True)
class KVTransfer:
    """One copy between GPU KV slots and host KV slots (a plan item).

    ``direction`` 'to_host' (write-back at eviction) or 'to_gpu' (prefetch at admission);
    ``gpu_slots[i]`` and ``host_slots[i]`` hold the same token; ``contiguous``: a HOT slab moved
    as one copy, else gathered on the GPU and moved as ``pieces`` copies (one per run of
    consecutive host slots)."""

    direction: str
    gpu_slots: np.ndarray
    host_slots: np.ndarray
    nbytes: int
    contiguous: bool
    pieces: int
    after_copies: int = 0  # apply after this many of the plan's HOT compaction copies (exact interleaving)

    @property
    def tokens(self) -> int:
        return int(self.gpu_slots.size)


@dataclass(frozen=True, slots=True)
class HostTierConfig:
    capacity_tokens: int
    bytes_per_token: int
    mode: str = "slabs"
    eviction: str = "lru"
    write: str = "all"

    def __post_init__(self):
        if self.capacity_tokens < 1 or self.bytes_per_token < 1:
            raise ValueError(f"host tier needs positive capacity and bytes per token, got {self}")
        if self.mode not in HOST_MODES or self.eviction not in HOST_EVICTIONS or self.write not in HOST_WRITES:
            raise ValueError(f"host tier mode/eviction/write {self.mode!r}/{self.eviction!r}/{self.write!r} unknown")


MAX_HOST_TOKENS = 1 << 26  # host-tier slots the simulator tracks (13 bytes of bookkeeping each): 8.8 TB of Llama-3.1-8B KV


def host_tier_config(scenario, model) -> HostTierConfig | None:
    """The tier of a scenario (None when ``hardware.host_kv_gb`` is 0: no tier). ValueError naming the field when
    the host holds more than MAX_HOST_TOKENS tokens of ``model``'s KV, or less than one."""
    gb = getattr(scenario.hardware, "host_kv_gb", 0.0)
    if not gb:
        return None
    per_token = model.kv_bytes_per_token
    tokens = gb * 1e9 / per_token
    if not tokens < MAX_HOST_TOKENS:  # also inf: a value near the float maximum overflows
        raise ValueError(
            f"field hardware.host_kv_gb = {gb}: a host tier of {tokens:.3g} tokens; the simulator keeps 13 bytes of "
            f"bookkeeping per host token, so at most {MAX_HOST_TOKENS} tokens "
            f"({MAX_HOST_TOKENS * per_token / 1e9:.0f} GB of {model.name}'s KV)")
    cap = int(gb * 1e9 // per_token)
    if cap < 1:  # a tier asked for (host_kv_gb > 0) that would hold nothing: said, not silently dropped
        raise ValueError(
            f"field hardware.host_kv_gb = {gb}: less than one token of {model.name}'s KV ({per_token} bytes"
            f"{' per GPU' if getattr(model, 'tp', 1) > 1 else ''}), so the tier would hold nothing; use 0 for no "
            f"host tier, or at least {per_token / 1e9:.3g}")
    pol = scenario.policy
    return HostTierConfig(cap, per_token, pol.host_tier_mode, pol.host_eviction, pol.host_write)


def _path_tokens(node: RadixNode) -> np.ndarray:
    keys = []
    n = node
    while n.parent is not None:
        keys.append(n.key)
        n = n.parent
    return np.concatenate(keys[::-1]) if keys else np.empty(0, TOKEN_DTYPE)


class HostTier:
    def __init__(self, cfg: HostTierConfig, page_size: int):
        self.cfg = cfg
        self.page_size = page_size
        self.index = RadixIndex(page_size)
        self.pool = ColdPool(cfg.capacity_tokens, 0, name="host")
        self._queue: list[KVTransfer] = []
        self.copies_queued = lambda: 0  # the owner's count of compaction copies queued so far (ordering)
        # byte accounting: in = dropped + resident (prefetches read, they do not remove)
        self.bytes_in = 0
        self.bytes_dropped = 0
        self.bytes_prefetched = 0
        self.write_backs = 0
        self.write_skips = 0  # evicted runs not written back: never read since cached (write = "reused")
        self.prefetches = 0
        self.prefetch_tokens = 0
        # next_use: role key -> (admissions seen, first admission clock, last admission clock)
        self._clock = 0
        self._seen: dict[tuple[int, ...], tuple[int, int, int]] = {}

    # ---- roles (next_use) -------------------------------------------------------------------
    def note_admission(self, tokens: np.ndarray) -> None:
        self._clock += 1
        if self.cfg.eviction != "next_use":
            return
        key = tuple(tokens[:ROLE_KEY_TOKENS].tolist())
        n, first, _ = self._seen.get(key, (0, self._clock, self._clock))
        self._seen[key] = (n + 1, first, self._clock)

    def _expected_next(self, leaf: RadixNode) -> float:
        """Admission clock at which this leaf's role is next expected (inf: never seen)."""
        root_child = leaf
        while root_child.parent is not self.index.root:
            root_child = root_child.parent
        got = self._seen.get(tuple(root_child.key[:ROLE_KEY_TOKENS].tolist()))
        if got is None:
            return float("inf")
        n, first, last = got
        gap = (last - first) / (n - 1) if n > 1 else float(max(1, self._clock - first) * 2)
        return last + gap

    # ---- eviction on the host -----------------------------------------------------------------
    def _drop(self, leaf: RadixNode) -> None:
        self.pool.free_slots(leaf.value)
        self.bytes_dropped += len(leaf) * self.cfg.bytes_per_token

    def _make_room(self, n: int) -> bool:
        if self.pool.free >= n:
            return True
        if self.cfg.eviction == "lru":
            self.index.evict(n - self.pool.free, "host", self._drop)
        else:
            while self.pool.free < n:
                leaves = self.index.evictable_leaves("host")
                if not leaves:
                    break
                victim = max(leaves, key=lambda x: (self._expected_next(x), -x.last_access, -x.id))
                self.index.remove_leaf(victim)
                self._drop(victim)
        return self.pool.free >= n

    # ---- write-back ---------------------------------------------------------------------------
    def write_back(self, node: RadixNode) -> None:
        """``node`` was just evicted from the GPU index (its parent chain is still intact and
        its slots not yet reused): copy the part of its path the host lacks."""
        if self.cfg.mode == "slabs" and node.pool != "hot":
            return
        if self.cfg.write == "reused" and not node.hits:
            self.write_skips += 1
            return
        tokens = _path_tokens(node)
        m = self.index.match_prefix(tokens)
        start = m.length
        n = tokens.size - start
        if n <= 0:
            return  # already on host (a prefetched run evicted again): nothing moves
        if n > self.cfg.capacity_tokens:
            return
        self.index.lock(m.node)  # keep the path being extended while making room
        ok = self._make_room(n)
        self.index.unlock(m.node)
        if not ok:
            return
        host = self.pool.allocate(n)
        _, already = self.index.insert(tokens, host, "host", below=m.node)
        assert already == start
        pos = 0  # one transfer per GPU node on the moved part: a HOT slab's is one contiguous copy
        for g in [*path_to(node.parent), node] if node.parent is not None else [node]:
            lo, hi = max(pos, start), pos + len(g)
            if hi > lo:
                self._push("to_host", g.value[lo - pos : hi - pos], host[lo - start : hi - start], g.pool == "hot")
            pos = hi
        self.bytes_in += n * self.cfg.bytes_per_token
        self.write_backs += 1

    # ---- prefetch -----------------------------------------------------------------------------
    def match(self, tokens: np.ndarray, max_len: int) -> tuple[int, np.ndarray, RadixNode]:
        """(host-held prefix length of ``tokens`` up to ``max_len``, its host slots, the host node:
        lock it while the copy is planned, so that no write-back reuses those host slots)."""
        m = self.index.match_prefix(tokens, max_len)
        return m.length, path_slots(m.node) if m.length else np.empty(0, np.int64), m.node

    def prefetch(self, gpu_slots: np.ndarray, host_slots: np.ndarray, slab: bool) -> None:
        self._push("to_gpu", gpu_slots, host_slots, slab)
        self.bytes_prefetched += int(gpu_slots.size) * self.cfg.bytes_per_token
        self.prefetches += 1
        self.prefetch_tokens += int(gpu_slots.size)

    def _push(self, direction: str, gpu: np.ndarray, host: np.ndarray, slab: bool) -> None:
        """Queue one copy; ``slab``: the GPU side is one HOT slab. The engine moves each run of consecutive
        host slots as one copy across the link (gpu_backend/executor/transfers.py): those runs are the
        transfer's ``pieces``, and a slab that lands in one run is a ``contiguous`` copy."""
        gpu, host = np.asarray(gpu, np.int64).copy(), np.asarray(host, np.int64).copy()
        runs = run_starts(host).size
        contiguous = slab and runs == 1
        self._queue.append(KVTransfer(direction, gpu, host, int(gpu.size) * self.cfg.bytes_per_token, contiguous,
                                      1 if contiguous else runs, self.copies_queued()))

    def take(self) -> list[KVTransfer]:
        out, self._queue = self._queue, []
        return out

    # ---- reports ------------------------------------------------------------------------------
    @property
    def resident_bytes(self) -> int:
        return self.pool.used * self.cfg.bytes_per_token
