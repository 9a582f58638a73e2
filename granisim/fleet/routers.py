"""Router policies: pure functions ``route(request, views, state) -> (replica index, state)``.

``views`` is one frozen :class:`~granisim.fleet.views.ReplicaView` per replica (down
replicas have ``up = False`` and are never chosen); ``state`` is whatever the policy
remembers (a counter, a hash ring, a role placement), immutable, passed in and returned.
Same views, same state ⇒ same answer. :class:`Router` holds a policy and its state for
the fleet loop. Ties always go to the lowest replica index.

* ``round_robin`` — the next replica that is up.
* ``least_load`` — fewest outstanding tokens (prompt still to compute + outputs still to
  generate), as Vidur's least-outstanding router.
* ``cache_aware`` — SGLang's router: if the load (requests queued + running) is
  imbalanced — max − min > ``balance_abs`` and max > ``balance_rel`` × min — the least
  loaded replica; else the replica holding the longest cached prefix of the request if
  that covers at least ``cache_threshold`` of the prompt; else the one with the most free KV.
* ``role_affinity`` — bounded-load consistent hashing (Mirrokni et al.) of the role:
  clockwise on a hash ring from the role's point, the first replica whose load stays
  within ``load_factor`` × the mean.
* ``hot_aware`` — ours: roles are placed on replicas so that each replica's HOT pool
  holds the slabs of its roles (as many roles per replica as its HOT pool has 16K slabs,
  popular roles on several replicas), from the arrival counts; the placement is reviewed
  every ``rebalance_every`` arrivals and follows shifts in popularity, keeping a role where
  it is while that stays balanced. A request goes to the least-loaded replica of its role
  unless the fleet is imbalanced (as ``cache_aware``), then to the least-loaded one.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from granisim.fleet.views import ReplicaView, RequestView

Views = Sequence[ReplicaView]


def _up(views: Views) -> list[ReplicaView]:
    up = [v for v in views if v.up]
    if not up:
        raise ValueError("no replica is up")  # the fleet holds requests while every replica is down
    return up


def _least(up: list[ReplicaView]) -> int:
    return min(up, key=lambda v: (v.outstanding_tokens, v.load, v.index)).index


def _imbalanced(up: list[ReplicaView], balance_abs: int, balance_rel: float) -> bool:
    loads = [v.load for v in up]
    hi, lo = max(loads), min(loads)
    return hi - lo > balance_abs and hi > balance_rel * lo


# ---- round robin ------------------------------------------------------------------------------
def round_robin(req: RequestView, views: Views, state: int) -> tuple[int, int]:
    n = len(views)
    for k in range(n):
        i = (state + k) % n
        if views[i].up:
            return i, (i + 1) % n
    raise ValueError("no replica is up")  # as _up says; checked after the search, not by a pass before it


# ---- least load -------------------------------------------------------------------------------
def least_load(req: RequestView, views: Views, state=None):
    return _least(_up(views)), state


# ---- cache aware (SGLang) ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CacheAware:
    balance_abs: int = 32
    balance_rel: float = 1.0001
    cache_threshold: float = 0.5


def cached_share(req: RequestView, v: ReplicaView) -> float:
    """Share of the request's prompt that replica ``v`` holds cached (its role prefix or nothing)."""
    if req.shared_len <= 0 or req.role not in v.cached_roles:
        return 0.0
    return req.shared_len / max(1, req.prompt_len)


def cache_aware(req: RequestView, views: Views, state: CacheAware) -> tuple[int, CacheAware]:
    up = _up(views)
    if _imbalanced(up, state.balance_abs, state.balance_rel):
        return min(up, key=lambda v: (v.load, v.outstanding_tokens, v.index)).index, state
    best = max(up, key=lambda v: (cached_share(req, v), -v.load, -v.index))
    share = cached_share(req, best)
    if share > 0 and share >= state.cache_threshold:
        return best.index, state
    return max(up, key=lambda v: (v.free_kv, -v.load, -v.index)).index, state


# ---- role affinity (bounded-load consistent hashing) -------------------------------------------
def _hash(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}/{key}".encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class HashRing:
    points: tuple[int, ...]  # sorted hash points
    owners: tuple[int, ...]  # replica of each point
    seed: int = 0
    load_factor: float = 1.25


def make_ring(n_replicas: int, seed: int = 0, load_factor: float = 1.25, vnodes: int = 64) -> HashRing:
    pts = sorted((_hash(seed, f"replica/{i}/{v}"), i) for i in range(n_replicas) for v in range(vnodes))
    return HashRing(tuple(p for p, _ in pts), tuple(i for _, i in pts), seed, load_factor)


def affinity_key(req: RequestView) -> str:
    if req.role >= 0:
        return f"role/{req.role}"
    return f"session/{req.session}" if req.session >= 0 else f"request/{req.rid}"


def role_affinity(req: RequestView, views: Views, ring: HashRing) -> tuple[int, HashRing]:
    up = _up(views)
    cap = math.ceil(ring.load_factor * (sum(v.load for v in up) + 1) / len(up))
    start = bisect.bisect_left(ring.points, _hash(ring.seed, affinity_key(req)))
    n = len(ring.points)
    for k in range(n):
        i = ring.owners[(start + k) % n]
        if views[i].up and views[i].load + 1 <= cap:
            return i, ring
    return _least(up), ring  # unreachable: some replica is at or below the mean


# ---- hot aware (ours) ---------------------------------------------------------------------------
Placement = tuple[tuple[int, ...], ...]  # role -> replicas that hold it


def place_roles(demand: Sequence[float], slots: Sequence[int], previous: Placement | None = None,
                tolerance: float = 0.25) -> Placement:
    """Roles onto replicas: each role on ceil(share × replicas) of them (at least one), the most
    popular first, each copy on the replica with HOT room and the least assigned demand; a role
    stays where it was while that keeps the replica within ``tolerance`` of its fair share."""
    n, k = len(slots), len(demand)
    total = float(sum(demand))
    shares = [d / total for d in demand] if total > 0 else [1.0 / k] * k
    load, used = [0.0] * n, [0] * n
    out: list[tuple[int, ...]] = [()] * k
    fair = (1.0 + tolerance) / n
    for r in sorted(range(k), key=lambda r: (-shares[r], r)):
        copies = min(n, max(1, math.ceil(shares[r] * n - 1e-9)))
        per = shares[r] / copies
        prev = set(previous[r]) if previous is not None and r < len(previous) else set()
        chosen: list[int] = []
        for _ in range(copies):
            i = min((i for i in range(n) if i not in chosen),
                    key=lambda i: (used[i] >= slots[i], load[i] + per > fair + 1e-12, i not in prev, load[i], i))
            chosen.append(i)
            load[i] += per
            used[i] += 1
        out[r] = tuple(sorted(chosen))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class HotAware:
    balance_abs: int = 32
    balance_rel: float = 1.0001
    rebalance_every: int = 256
    roles: int = 0  # roles known from the workload (more are added as they arrive)
    placement: Placement | None = None  # None: placed at the first arrival (uniform demand)
    demand: tuple[float, ...] = ()  # smoothed arrivals per role at the last review
    window: tuple[int, ...] = ()  # arrivals per role since the last review
    reviews: int = 0


def _slots(views: Views, prefix_len: int) -> list[int]:
    return [max(1, v.hot_capacity // prefix_len) if prefix_len else 1 for v in views]


def hot_aware(req: RequestView, views: Views, state: HotAware) -> tuple[int, HotAware]:
    up = _up(views)
    if req.role < 0 or req.shared_len <= 0:
        return _least(up), state
    k = max(state.roles, len(state.demand), len(state.window), req.role + 1)
    window = tuple(state.window) + (0,) * (k - len(state.window))
    window = window[: req.role] + (window[req.role] + 1,) + window[req.role + 1 :]
    demand = tuple(state.demand) + (0.0,) * (k - len(state.demand))
    placement = state.placement
    if placement is None or len(placement) < k:
        placement = place_roles([1.0] * k, _slots(views, req.shared_len), placement)
    if sum(window) >= state.rebalance_every:
        demand = tuple(0.5 * d + 0.5 * w for d, w in zip(demand, window)) if state.reviews else \
            tuple(float(w) for w in window)
        placement = place_roles(demand, _slots(views, req.shared_len), placement)
        window = (0,) * k
        state = replace(state, reviews=state.reviews + 1)
    state = replace(state, placement=placement, demand=demand, window=window)
    if _imbalanced(up, state.balance_abs, state.balance_rel):
        return _least(up), state
    mine = [views[i] for i in placement[req.role] if views[i].up]
    return _least(mine or up), state


# ---- replayed routing (validation) ------------------------------------------------------------------
@dataclass(frozen=True)
class Replayed:
    """Each request's replica as another run of the fleet routed it (rid -> replica), e.g. the real fleet's;
    read only."""
    replica_of: dict[int, int]


def replayed(pairs) -> Replayed:
    return Replayed({int(r): int(i) for r, i in pairs})


def replay(req: RequestView, views: Views, state: Replayed) -> tuple[int, Replayed]:
    """The replica the recorded run chose, if it is up; else (a request the record lacks, a replica down) the
    least-loaded one. Not a serving policy: `granisim validate` uses it to run the simulated fleet on the real
    fleet's routing, so that each replica is judged on the requests it served."""
    up = _up(views)
    i = state.replica_of.get(req.rid)
    return (i if i is not None and views[i].up else _least(up)), state


# ---- the registry and the stateful holder ---------------------------------------------------------
Policy = Callable[[RequestView, Views, object], tuple[int, object]]
UP_ONLY: frozenset = frozenset({round_robin})  # policies that read of each view only whether it is up


NO_REQUEST: frozenset = frozenset({round_robin})  # policies that read nothing of the request


def reads_no_request(policy) -> bool:
    """Whether ``policy`` reads nothing of the request it routes: the fleet then passes None, not its view."""
    return any(policy is p for p in NO_REQUEST)


def reads_only_up(policy) -> bool:
    """Whether ``policy`` reads nothing of a view but ``up`` (and its position): the fleet then need not
    take the replicas' views (their load and cache), which costs a pass per replica per arrival."""
    return any(policy is p for p in UP_ONLY)


POLICIES: dict[str, Policy] = dict(round_robin=round_robin, least_load=least_load, cache_aware=cache_aware,
                                   role_affinity=role_affinity, hot_aware=hot_aware)


def initial_state(name: str, cfg, n_replicas: int, seed: int = 0, roles: int = 0):
    """The policy's starting state from the scenario's [fleet] section."""
    if name == "round_robin":
        return 0
    if name == "cache_aware":
        return CacheAware(cfg.balance_abs, cfg.balance_rel, cfg.cache_threshold)
    if name == "role_affinity":
        return make_ring(n_replicas, seed, cfg.load_factor)
    if name == "hot_aware":
        return HotAware(cfg.balance_abs, cfg.balance_rel, cfg.rebalance_every, roles)
    if name == "least_load":
        return None
    raise ValueError(f"unknown router {name!r}; use one of {', '.join(POLICIES)}")


class Router:
    """A policy and its current state; ``route`` asks the policy and keeps the state it returns."""

    def __init__(self, name: str, state, policy: Policy | None = None):
        self.name, self.policy, self.state = name, policy or POLICIES[name], state
        self.decisions = 0

    def route(self, req: RequestView, views: Views) -> int:
        i, self.state = self.policy(req, views, self.state)
        self.decisions += 1
        return i
