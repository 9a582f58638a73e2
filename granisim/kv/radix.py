"""Radix index over token-id sequences (RadixAttention semantics), integers only.

Each node holds a run of token ids (``key``) and the slot ids of their K/V rows
(``value``), plus the pool that owns those slots. Matching splits a node on a partial
match; ``lock``/``unlock`` count references along the path to the root (a locked node
and its ancestors are never evicted); eviction frees unlocked leaves in LRU order.

With ``page_size`` N > 1 every key length is a multiple of N and matches are floored to
whole pages, as in a paged prefix cache (children are keyed by their first page).

LRU uses a logical clock (not wall time) so that runs are reproducible. The LRU order is
kept incrementally: one heap per pool of ``(last_access, id)`` entries, pushed whenever a
node becomes an unlocked leaf or is touched while one, and checked when popped (lazy
deletion: an entry whose node has since been locked, touched, given children or removed is
skipped). Eviction therefore pops in exactly the order of a heap rebuilt from every
unlocked leaf, without the rebuild.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from granisim.frozen import slot_setters

TOKEN_DTYPE = np.int32  # token ids (below 2^31 for every vocabulary): as requests hold them


class RadixNode:
    __slots__ = ("id", "key", "value", "pool", "slab", "parent", "children", "lock_ref", "last_access", "run",
                 "same_as", "hits")

    def __init__(self, node_id: int, key: np.ndarray, value: np.ndarray, pool: str, parent: "RadixNode | None"):
        self.id = node_id
        self.key = key
        self.value = value
        self.pool = pool
        self.slab: int | None = None  # HOT slab id when the value is one contiguous slab
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        # (value, whether its slot ids are consecutive ascending): the prefix-group test's cache, valid
        # while ``value`` is that array (values are replaced, never written in place)
        self.run: tuple[np.ndarray, bool] | None = None
        # (array, offset): ``key`` was found equal to ``array[offset : offset + len(key)]`` (a prompt's
        # known prefix, see match_prefix), so a later match against the same array need not compare them
        self.same_as: tuple[np.ndarray, int] | None = None
        self.hits = 0  # matches that reached into this run since it was cached (the host tier's "reused")

    def __len__(self) -> int:
        return self.key.size  # a Python int already

    def __repr__(self) -> str:
        return f"RadixNode(id={self.id}, len={len(self)}, pool={self.pool}, lock={self.lock_ref})"


@dataclass(frozen=True, slots=True)
class MatchResult:
    node: RadixNode  # deepest matched node (the root when nothing matched)
    length: int  # matched tokens

    def path(self) -> list[RadixNode]:
        """Nodes from the root's first child down to ``node``."""
        return path_to(self.node)


_MATCH_NODE, _MATCH_LENGTH = slot_setters(MatchResult)


def match_result(node: RadixNode, length: int) -> MatchResult:
    """``MatchResult(node, length)`` (an equal object) without the frozen ``__init__`` (two or three
    matches per request)."""
    o = object.__new__(MatchResult)
    _MATCH_NODE(o, node)
    _MATCH_LENGTH(o, length)
    return o


def path_to(node: RadixNode) -> list[RadixNode]:
    """Nodes from the root's first child down to ``node``."""
    out = []
    while node.parent is not None:
        out.append(node)
        node = node.parent
    return out[::-1]


class RadixIndex:
    def __init__(self, page_size: int = 1, on_split: Callable[[RadixNode, RadixNode], None] | None = None):
        if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)) or page_size < 1:
            raise ValueError(f"radix index page_size must be an integer >= 1, got {page_size!r}")
        self.page_size = page_size
        self.root = RadixNode(0, np.empty(0, TOKEN_DTYPE), np.empty(0, np.int64), "root", None)
        self.root.lock_ref = 1  # the root is never evicted
        self._next_id = 1
        self._clock = 0
        self._on_split = on_split  # (head, tail): lets the owner split a HOT slab in step
        self._leaves: set[RadixNode] = set()  # nodes without children (never the root)
        # pool -> heap of (last_access, id, push count, node); every unlocked leaf of the pool has
        # an entry with its current (last_access, id); stale entries are skipped when popped
        self._lru: dict[str, list[tuple[int, int, int, RadixNode]]] = {}
        self._pushes = 0
        self.evictable: dict[str, int] = {}
        self.protected: dict[str, int] = {}
        self.num_nodes = 0

    # ---- helpers -------------------------------------------------------------------------
    def _child_key(self, tokens: np.ndarray, pos: int = 0) -> tuple[int, ...]:
        """The children's key of ``tokens[pos:]`` (its first page; at least a page is there)."""
        ps = self.page_size
        if ps == 1:
            return (tokens.item(pos),)  # tuple(tokens[pos : pos + 1].tolist()), without the slice
        return tuple(tokens[pos : pos + ps].tolist())

    def _common(self, a: np.ndarray, b: np.ndarray) -> int:
        k = min(a.size, b.size)
        m = k
        if k:
            neq = a[:k] != b[:k]
            first = int(neq.argmax())  # the first differing position (0 when none differs: checked)
            if neq[first]:
                m = first
        return m - m % self.page_size

    def _offer(self, node: RadixNode) -> None:
        """Record ``node`` (an unlocked leaf) under its current LRU key."""
        heap = self._lru.get(node.pool)
        if heap is None:
            heap = self._lru[node.pool] = []
        self._pushes += 1
        heapq.heappush(heap, (node.last_access, node.id, self._pushes, node))
        if len(heap) > 2 * len(self._leaves) + 64:  # mostly stale: rebuild from the live leaves
            pool = node.pool
            heap[:] = [(n.last_access, n.id, 0, n) for n in self._leaves if n.lock_ref == 0 and n.pool == pool]
            heapq.heapify(heap)

    def _account(self, node: RadixNode, sign: int) -> None:
        bucket = self.protected if node.lock_ref else self.evictable
        pool = node.pool
        bucket[pool] = bucket.get(pool, 0) + sign * node.key.size  # len(node), without its __len__

    def _split(self, child: RadixNode, m: int) -> RadixNode:
        """Cut ``child`` after ``m`` tokens; returns the new head node (the child keeps the tail)."""
        parent = child.parent
        head = RadixNode(self._next_id, child.key[:m], child.value[:m], child.pool, parent)
        self._next_id += 1
        self.num_nodes += 1
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        head.hits = child.hits
        child.key = child.key[m:]
        child.value = child.value[m:]
        if child.same_as is not None:  # the head keeps the known prefix's offset, the tail moves on
            head.same_as = child.same_as
            child.same_as = (child.same_as[0], child.same_as[1] + m)
        child.parent = head
        head.children[self._child_key(child.key)] = child
        parent.children[self._child_key(head.key)] = head
        if self._on_split is not None:
            self._on_split(head, child)
        return head

    # ---- matching and insertion ------------------------------------------------------------
    def match_prefix(self, tokens: np.ndarray, max_len: int | None = None,
                     known: np.ndarray | None = None) -> MatchResult:
        """Longest cached prefix of ``tokens`` (at most ``max_len``), splitting a partially matched node.
        ``known``: an array ``tokens`` starts with (a role's system prompt); a node found equal to part of
        it in an earlier match with the same array is not compared again (``RadixNode.same_as``)."""
        tokens = np.asarray(tokens, dtype=TOKEN_DTYPE)
        if max_len is not None:
            tokens = tokens[: max(0, max_len)]
        self._clock += 1  # the LRU clock: one tick a walk (two or three a request)
        return self._match_below(self.root, 0, tokens, self._clock, known)

    def _match_below(self, node: RadixNode, pos: int, tokens: np.ndarray, now: int,
                     known: np.ndarray | None = None) -> MatchResult:
        """``match_prefix``'s walk from ``node``, which holds ``tokens[:pos]`` on its path."""
        while pos + self.page_size <= tokens.size:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            end = pos + child.key.size
            if known is None or end > known.size or end > tokens.size:
                m = self._common(child.key, tokens[pos:])
            elif child.same_as is not None and child.same_as[0] is known and child.same_as[1] == pos:
                m = child.key.size  # equal to this part of the known prefix when last compared
            else:
                m = self._common(child.key, tokens[pos:])
                if m == child.key.size:
                    child.same_as = (known, pos)
            if m == 0:
                break
            partial = m < len(child)
            if partial:
                child = self._split(child, m)
            child.hits += 1
            child.last_access = now
            node, pos = child, pos + m
            if partial:
                break
        if node.lock_ref == 0 and node in self._leaves:  # only the deepest node can be a leaf
            self._offer(node)
        return match_result(node, pos)

    def rematch(self, m: MatchResult) -> MatchResult:
        """``match_prefix`` again of the tokens (and ``max_len``) that gave ``m``, no node having been
        created or removed since (``_next_id`` and ``num_nodes`` as then): the walk would visit the same
        nodes, ``m``'s path, and end at the same node (a split it made left the matched head whole and the
        tail starting with a page the tokens do not have), so this does what it would do to them, without
        comparing tokens: one clock tick, each node on the path one more hit and touched now, and the last
        offered to the LRU if it is an unlocked leaf."""
        self._clock += 1
        now = self._clock
        node = n = m.node
        while n.parent is not None:
            n.hits += 1
            n.last_access = now
            n = n.parent
        if node.lock_ref == 0 and node in self._leaves:
            self._offer(node)
        return m

    def insert(self, tokens: np.ndarray, slots: np.ndarray, pool: str,
               below: RadixNode | None = None, fixed: bool = False, locking: bool = False) -> tuple[RadixNode, int]:
        """Insert a sequence with its slots. Returns (deepest node, tokens that were already cached).

        The caller still owns the slots of the already-cached part (they duplicate the
        tree's) and must free them; the rest now belongs to the tree.

        ``below``: a node whose path holds the first ``tokens.size - slots.size`` tokens (a request's
        locked node); ``slots`` are then those of the rest. The same result as inserting every token
        with the path's slots in front, without comparing the path's tokens or gathering its slots.

        ``fixed``: ``tokens`` (an int32 array) never change afterwards (a finished request's buffer), so the
        new node may hold a view of them instead of a copy (where the view keeps little else alive).
        ``locking``: the caller locks the returned node before anything can evict, so a new leaf gets no LRU
        entry now (it would be stale when popped; unlocking offers it with its key then).
        """
        tokens = np.asarray(tokens, dtype=TOKEN_DTYPE)
        slots = np.asarray(slots, dtype=np.int64)
        skip = tokens.size - slots.size if below is not None else 0
        if skip < 0 or (below is None and tokens.size != slots.size):
            raise ValueError(f"radix insert: {tokens.size} tokens but {slots.size} slots")
        if tokens.size % self.page_size:
            raise ValueError(f"radix insert: length {tokens.size} is not a multiple of page_size {self.page_size}")
        path = path_to(below) if below is not None else []
        held = sum(len(n) for n in path)
        if held != skip:  # the path's length is checked; its tokens are the caller's word
            raise ValueError(f"radix insert: node {below.id} holds {held} tokens on its path, "
                             f"not the {skip} that the {slots.size} slots leave")
        self._clock += 1
        now = self._clock
        for n in path:  # match_prefix's walk down the path touches it
            n.last_access = now
        match = self._match_below(self.root if below is None else below, skip, tokens, now)
        node, pos = match.node, match.length
        if pos < tokens.size:
            value = slots[pos - skip:]
            if value.flags.writeable:  # a read-only array (a counting pool's placeholder ids) stays as it is
                value = value.copy()
            # a view holds the tokens before pos too: taken only where they are at most half of them
            key = tokens[pos:] if fixed and 2 * pos <= tokens.size else tokens[pos:].copy()
            leaf = RadixNode(self._next_id, key, value, pool, node)
            self._next_id += 1
            self.num_nodes += 1
            self._clock += 1
            leaf.last_access = self._clock
            node.children[self._child_key(leaf.key)] = leaf
            self._leaves.add(leaf)
            self._leaves.discard(node)
            self._account(leaf, +1)
            if not locking:
                self._offer(leaf)
            node = leaf
        return node, pos

    # ---- reference counts -----------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        root, evictable, protected = self.root, self.evictable, self.protected
        while node is not root:
            if node.lock_ref == 0:  # _account(node, -1), locked, _account(node, +1)
                pool, size = node.pool, node.key.size
                evictable[pool] = evictable.get(pool, 0) - size
                node.lock_ref = 1
                protected[pool] = protected.get(pool, 0) + size
            else:
                node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        # check the whole path first so a bad unlock leaves the state unchanged
        n = node
        while n is not self.root:
            if n.lock_ref <= 0:
                raise ValueError(f"radix unlock: node {n.id} would drop below zero references")
            n = n.parent
        self._clock += 1
        now = self._clock
        root, evictable, protected = self.root, self.evictable, self.protected
        while node is not root:
            node.last_access = now
            if node.lock_ref == 1:  # _account(node, -1), unlocked, _account(node, +1)
                pool, size = node.pool, node.key.size
                protected[pool] = protected.get(pool, 0) - size
                node.lock_ref = 0
                evictable[pool] = evictable.get(pool, 0) + size
                if node in self._leaves:
                    self._offer(node)
            else:
                node.lock_ref -= 1
            node = node.parent

    # ---- eviction -------------------------------------------------------------------------
    def evictable_leaves(self, pool: str | None = None) -> list[RadixNode]:
        """Unlocked leaves (of ``pool``), in no particular order."""
        return [n for n in self._leaves if n.lock_ref == 0 and (pool is None or n.pool == pool)]

    def remove_leaf(self, leaf: RadixNode) -> None:
        if leaf.children or leaf.lock_ref or leaf is self.root:
            raise ValueError(f"radix: node {leaf.id} is not an unlocked leaf")
        self._account(leaf, -1)
        parent = leaf.parent
        del parent.children[self._child_key(leaf.key)]
        self._leaves.discard(leaf)
        if parent is not self.root and not parent.children:
            self._leaves.add(parent)
            if parent.lock_ref == 0:
                self._offer(parent)
        self.num_nodes -= 1

    def evict(self, num_tokens: int, pool: str, free: Callable[[RadixNode], None]) -> int:
        """Evict unlocked leaves of ``pool`` in LRU order until ``num_tokens`` are freed.

        A cached run of ``pool`` whose children are all of another pool (a COLD run above a HOT slab) is
        never a leaf of its pool: once the leaves run out, the least recently used unlocked run of ``pool``
        goes with its subtree, and eviction continues with the leaves that remain. ``free`` releases a node's
        storage. Returns the tokens of ``pool`` freed (may fall short).
        """
        freed = self._evict_leaves(num_tokens, pool, free)
        while freed < num_tokens:
            rest = [x for x in self.nodes() if x.pool == pool and x.lock_ref == 0]
            if not rest:
                break
            before = self.evictable.get(pool, 0)
            self.evict_subtree(min(rest, key=lambda x: (x.last_access, x.id)), free)
            freed += before - self.evictable.get(pool, 0)
            freed += self._evict_leaves(num_tokens - freed, pool, free)
        return freed

    def _evict_leaves(self, num_tokens: int, pool: str, free: Callable[[RadixNode], None]) -> int:
        heap = self._lru.get(pool)
        freed = 0
        while heap and freed < num_tokens:
            last_access, _, _, leaf = heapq.heappop(heap)
            if leaf.lock_ref or leaf.last_access != last_access or leaf not in self._leaves:
                continue  # stale: locked, touched or no longer a leaf since it was pushed
            self.remove_leaf(leaf)  # offers the parent if it is now an unlocked leaf
            free(leaf)
            freed += leaf.key.size
        return freed

    def evict_subtree(self, node: RadixNode, free: Callable[[RadixNode], None]) -> int:
        """Evict an unlocked node with all its descendants (all unlocked, since locks reach the root)."""
        if node.lock_ref:
            raise ValueError(f"radix: cannot evict locked node {node.id}")
        freed = 0
        for child in list(node.children.values()):
            freed += self.evict_subtree(child, free)
        self.remove_leaf(node)
        free(node)
        return freed + len(node)

    def nodes(self) -> list[RadixNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out
