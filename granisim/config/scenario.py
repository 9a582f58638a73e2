"""Scenario files (TOML) validated by pydantic: every field, its default and its range.

A user mistake becomes a :class:`ScenarioError` with one line naming the file, the field
and the value; the CLI prints it and exits with status 2. Files are read strictly: a number
must be a TOML number (not a string, not a boolean), an integer field an integer, and no
number may be ``inf`` or ``nan``. A field that cannot have an effect given the others (e.g.
``workload.rate`` when arrivals come from the trace) is rejected rather than ignored.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

POLICY_RE = re.compile(r"^(granikv|token|paged(\d*))$")


class ScenarioError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelCfg(_Strict):
    name: str = "llama-3.1-8b"
    # mixture-of-experts models only: how tokens pick experts (the cost model's expected active experts)
    expert_routing: Literal["uniform", "zipf"] | None = None  # None: uniform (for MoE models)
    expert_zipf_s: float | None = Field(None, gt=0)  # zipf routing's exponent (default 1.0)

    @model_serializer(mode="wrap")
    def _without_unset_moe(self, handler):
        return _drop_defaults(handler(self), {"expert_routing": None, "expert_zipf_s": None})


MAX_STEP_TIME_SCALE = 10  # hardware.step_time_scale: a what-if beyond 10x is no longer a sensitivity question


class HardwareCfg(_Strict):
    profile: str = "a100-80gb"  # name of a shipped profile or a path to a profile JSON
    mem_fraction: float = Field(0.9, gt=0, le=1)  # share of GPU memory the engine may take
    reserve_gb: float = Field(4.0, ge=0)  # activations, workspace, CUDA graphs
    kv_budget_tokens: int | None = Field(None, gt=0)  # override the derived budget
    tp: Literal[1, 2, 4, 8] = 1  # tensor-parallel GPUs per replica (the profile's GPU, tp of them)
    # host memory for evicted KV (granisim/kv/host_tier.py); 0 = no host tier
    host_kv_gb: float = Field(0.0, ge=0, allow_inf_nan=False)
    # a what-if for sensitivity analysis: every step's predicted time (cost model) times this; 1 = as priced
    step_time_scale: float = Field(1.0, gt=0, le=MAX_STEP_TIME_SCALE, allow_inf_nan=False)

    @field_validator("tp", mode="before")
    @classmethod
    def _tp_integer(cls, v):  # a Literal compares by ==: true would pass as 1 and 4.0 as 4
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("use an integer: 1, 2, 4 or 8")
        return v

    @model_serializer(mode="wrap")
    def _without_default_tp(self, handler):
        return _drop_defaults(handler(self), {"tp": 1, "host_kv_gb": 0.0, "step_time_scale": 1.0})


def _drop_defaults(data, defaults: dict):
    """A dump without fields added later at their defaults: earlier scenarios' dumps (sweep point ids) stay
    as they were."""
    if isinstance(data, dict):
        for k, v in defaults.items():
            if k in data and data[k] == v:
                del data[k]
    return data


class PolicyCfg(_Strict):
    name: str = "granikv"  # granikv | token | paged | paged<N>
    hot_fraction: float | Literal["adaptive"] = 0.2  # in [0, 1], or "adaptive" (boundary follows demand)
    page_size: int = Field(16, ge=1)  # for `paged` without a number
    m_sat: int | None = Field(None, ge=1)  # dense when M_eff >= m_sat; default: the profile's
    # threshold (the m_sat rule) | cost (cost model picks dense or cascade) | auto (cost model picks dense,
    # cascade or no prefix pass) | cascade / dense: forced (dense needs a slab)
    dispatch: Literal["threshold", "cost", "auto", "cascade", "dense"] = "threshold"
    # with [hardware] host_kv_gb > 0: what eviction moves to host ("slabs": HOT slabs only, granikv;
    # "slabs+pages": COLD / token / paged pages too; unset: see host_tier_mode) and which host KV goes first when host
    # memory is full
    host_tier: Literal["slabs", "slabs+pages"] | None = None
    host_eviction: Literal["lru", "next_use"] = "lru"
    host_write: Literal["all", "reused"] = "all"  # "reused": only runs read since they were cached go to host

    @model_serializer(mode="wrap")
    def _without_default_host(self, handler):
        return _drop_defaults(handler(self), {"host_tier": None, "host_eviction": "lru", "host_write": "all"})

    @property
    def host_tier_mode(self) -> str:
        """What a host tier moves: ``host_tier`` as written, else ``slabs`` where the policy keeps HOT slabs
        (granikv with a HOT pool) and ``slabs+pages`` where it has none (token, paged: their pages, as SGLang's
        HiCache moves them), so that a default never makes a policy refuse the tier."""
        if self.host_tier is not None:
            return self.host_tier
        return "slabs" if self.name == "granikv" and self.hot_fraction != 0 else "slabs+pages"

    @field_validator("hot_fraction", mode="before")
    @classmethod
    def _hot_fraction(cls, v):
        if v == "adaptive":
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise ValueError("use a number in [0, 1] or 'adaptive'")
        if not 0 <= v <= 1:
            raise ValueError("must be within [0, 1] (or 'adaptive')")
        return float(v)

    @field_validator("name")
    @classmethod
    def _policy(cls, v: str) -> str:
        m = POLICY_RE.match(v)
        if not m:
            raise ValueError(f"unknown policy {v!r}; use granikv, token, paged or paged<N> (e.g. paged16)")
        if m.group(2) and int(m.group(2)) < 1:
            raise ValueError("the page size N of paged<N> must be >= 1 (e.g. paged16)")
        return v


class SchedulerCfg(_Strict):
    max_batch_tokens: int = Field(8192, ge=1)  # new tokens per step (prefill chunks + decodes)
    max_running: int = Field(256, ge=1)
    preempt_order: Literal["retract", "lifo"] = "retract"  # SGLang's retract order | vLLM's LIFO
    new_token_ratio: float = Field(0.3, ge=0, le=1)  # share of outstanding outputs reserved at admission
    fast_forward: bool = True  # advance identical decode steps at once where exact
    max_waiting: int = Field(0, ge=0)  # 0 = unlimited queue; else arrivals beyond are rejected
    queue_timeout_s: float = Field(0.0, ge=0)  # 0 = wait forever; else waiting longer is rejected
    # fcfs | prefix: tenancy-aware, waiting requests whose prefix a running request holds go first
    admission: Literal["fcfs", "prefix"] = "fcfs"
    admission_max_wait_s: float = Field(0.0, ge=0)  # prefix admission: older waiters go first (0 = no aging)


# every role's prefix is drawn up front and every replica built before a run: beyond these a scenario would run out of
# memory or time before its first step (written as powers: see granisim/core/heap.py, SIMULATION). Requests: each
# holds a few numbers from the start (about 1-2 KB over a run: reports/sim_speed/README.md)
MAX_ROLES, MAX_PREFIX_TOKENS, MAX_REPLICAS, MAX_REQUESTS = 2**20, 2**30, 2**12, 2**27
# a span of simulated time (arrivals, think times) beyond this is a mistake: about 34 years, where float seconds still
# resolve 0.25 us; the run's clock must stay below MAX_CLOCK_S (2 us resolution) for step times to add up
MAX_TIME_S, MAX_CLOCK_S = 2.0**30, 2.0**33


class WorkloadCfg(_Strict):
    kind: Literal["multi_agent", "control", "azure"] = "multi_agent"
    num_requests: int = Field(0, ge=0, le=MAX_REQUESTS)  # 0 = as many as the trace has rows
    rate: float = Field(1.0, gt=0)  # Poisson arrivals per second
    arrivals: Literal["poisson", "trace"] = "poisson"
    roles: int = Field(4, ge=1, le=MAX_ROLES)  # k: distinct agent prefixes
    prefix_len: int = Field(16384, ge=1)  # L_p
    role_dist: Literal["uniform", "zipf"] = "uniform"
    zipf_s: float = Field(1.0, gt=0)
    trace: str | None = None  # CSV with arrived_at, num_prefill_tokens, num_decode_tokens
    time_scale: float = Field(1.0, gt=0)  # trace timestamps divided by this
    suffix_scale: float = Field(1.0, gt=0)
    output_scale: float = Field(1.0, gt=0)
    max_output_len: int = Field(0, ge=0)  # 0 = no cap
    turns: int = Field(1, ge=1)  # turns per session (multi-turn when > 1)
    think_time_s: float = Field(0.0, ge=0, le=MAX_TIME_S)
    followup_scale: float = Field(0.25, gt=0)  # follow-up message length vs a trace prompt
    # prompt/output lengths from this trace instead (shipped name `arxiv`, or a CSV path); arrivals unchanged
    lengths_trace: str | None = None

    @field_validator("lengths_trace")
    @classmethod
    def _lengths_trace(cls, v):
        if v is not None:
            from granisim.config.files import unreadable
            from granisim.core.workload import TraceError, load_lengths

            try:
                load_lengths(v)
            except OSError as err:
                raise ValueError(unreadable(err, "file not found (give a CSV path or a shipped name: arxiv)")) from None
            except TraceError as err:
                raise ValueError(str(err)) from None
        return v

    @model_validator(mode="after")
    def _prefixes_fit(self):
        tokens = self.roles * self.prefix_len
        if self.kind != "azure" and tokens > MAX_PREFIX_TOKENS:
            raise ValueError(f"field workload.roles = {self.roles}: {self.roles} roles x prefix_len {self.prefix_len} = "
                             f"{tokens:.3g} prefix tokens, drawn up front; at most 2^30 (about 1.07e+09)")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_lengths(self, handler):
        return _drop_defaults(handler(self), {"lengths_trace": None})


ROUTERS = ("round_robin", "least_load", "cache_aware", "role_affinity", "hot_aware")


class FleetGroupCfg(_Strict):
    """Replicas that differ from the scenario's own hardware profile or policy (heterogeneous fleets)."""
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    profile: str | None = None  # default: [hardware] profile
    policy: str | None = None  # default: [policy] name

    @field_validator("policy")
    @classmethod
    def _policy(cls, v):
        return v if v is None else PolicyCfg._policy(v)


class FleetFaultCfg(_Strict):
    replica: int = Field(ge=0)  # index in the fleet (groups in order)
    at_s: float = Field(ge=0, le=MAX_TIME_S)
    for_s: float | None = Field(None, gt=0, le=MAX_TIME_S)  # absent = down for good


class FleetCfg(_Strict):
    groups: tuple[FleetGroupCfg, ...] = ()
    replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS)  # default 1; with groups: their sum (may be left out)
    router: Literal[ROUTERS] = "round_robin"
    staleness_s: float = Field(0.0, ge=0, le=MAX_TIME_S)  # the router's views are refreshed this often (0 = live)
    balance_abs: int = Field(32, ge=0)  # cache_aware / hot_aware: imbalance = max - min load > this ...
    balance_rel: float = Field(1.0001, ge=1)  # ... and max load > this x min load
    cache_threshold: float = Field(0.5, ge=0, le=1)  # cache_aware: least cached-prefix share to follow the cache
    # role_affinity: a replica takes at most this x the mean load (2^20: a replica never spills, in any fleet)
    load_factor: float = Field(1.25, ge=1, le=2.0**20)
    rebalance_every: int = Field(256, ge=1)  # hot_aware: arrivals between placement reviews
    faults: tuple[FleetFaultCfg, ...] = ()  # replica indices are checked against the fleet's size when it is built

    @field_validator("groups", "faults", mode="before")
    @classmethod
    def _tables(cls, v):  # TOML gives arrays of tables as lists (files are read strictly)
        return tuple(v) if isinstance(v, list) else v

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v, info):
        groups = info.data.get("groups") or ()
        if groups and v is not None and v != sum(g.replicas for g in groups):
            raise ValueError(f"the groups hold {sum(g.replicas for g in groups)} replicas (leave replicas out)")
        return v

    @model_validator(mode="after")
    def _size(self):
        if self.size > MAX_REPLICAS:
            raise ValueError(f"field fleet.groups: {len(self.groups)} groups hold {self.size} replicas; at most "
                             f"{MAX_REPLICAS}")
        return self

    @property
    def size(self) -> int:
        return sum(g.replicas for g in self.groups) if self.groups else (self.replicas or 1)


class Scenario(_Strict):
    name: str = Field("scenario", min_length=1)
    seed: int = Field(0, ge=0)
    model: ModelCfg = ModelCfg()
    hardware: HardwareCfg = HardwareCfg()
    policy: PolicyCfg = PolicyCfg()
    scheduler: SchedulerCfg = SchedulerCfg()
    workload: WorkloadCfg = WorkloadCfg()
    fleet: FleetCfg | None = None  # absent: one replica, the single-GPU loop

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():  # it names the output folder (out/NAME)
            raise ValueError("blank; give a non-empty name")
        parts = re.split(r"[/\\]", v)
        if ".." in parts:
            raise ValueError("'..' would put the output folder (out/NAME) outside out/; give a plain name")
        if all(p in ("", ".") for p in parts):
            raise ValueError("names the output folder (out/NAME) itself, not a folder in it; give a plain name")
        if any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError("a control character (a newline, a NUL, ...) in a folder name; give a plain name")
        return v

    @model_validator(mode="after")
    def _host_tier_usable(self):
        """A tier of HOT slabs alone needs every replica's policy to keep HOT slabs: the scenario's own, unless
        every replica group names another (fleet/build.py)."""
        if not (self.hardware.host_kv_gb and self.policy.host_tier == "slabs"):
            return self
        groups = self.fleet.groups if self.fleet is not None else ()
        own = not groups or any(g.policy is None for g in groups)  # some replica runs [policy] name
        runs = [("policy.host_tier = 'slabs'", self.policy.name)] if own else []  # (field to blame, policy run)
        for i, g in enumerate(groups):
            if g.policy is not None and all(g.policy != name for _, name in runs):
                runs.append((f"fleet.groups.{i}.policy = {g.policy!r}", g.policy))
        for where, name in runs:
            why = None
            if name != "granikv":
                why = f"policy {name} has no HOT slabs to move to host"
            elif self.policy.hot_fraction == 0:
                why = "policy.hot_fraction = 0 leaves no HOT slabs to move to host"
            if why:
                under = "" if where.startswith("policy.") else "under policy.host_tier = 'slabs', "
                raise ValueError(f"field {where}: {under}{why} (hardware.host_kv_gb = {self.hardware.host_kv_gb}); "
                                 f"use host_tier = 'slabs+pages' or host_kv_gb = 0")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_fleet(self, handler):
        data = handler(self)  # no `fleet` key when absent: single-GPU dumps (sweep point ids) stay as they were
        if isinstance(data, dict) and data.get("fleet", 0) is None:
            del data["fleet"]
        return data

    def with_changes(self, **dotted) -> "Scenario":
        """Copy with fields replaced by dotted name, e.g. ``{"policy.name": "token"}``."""
        data = self.model_dump()
        for key, value in dotted.items():
            target, parts = data, key.split(".")
            for p in parts[:-1]:
                if p not in target or not isinstance(target[p], dict):
                    raise ScenarioError(f"unknown scenario field {key!r}")
                target = target[p]
            if parts[-1] not in target and not _optional_field(parts):
                raise ScenarioError(f"unknown scenario field {key!r}")
            target[parts[-1]] = value
        return parse_scenario(data, source="<override>")


def _optional_field(parts: list[str]) -> bool:
    """A field that dumps leave out at its default (hardware.tp, model.expert_*)."""
    return len(parts) == 2 and (parts[0], parts[1]) in (("hardware", "tp"), ("hardware", "host_kv_gb"),
                                                          ("hardware", "step_time_scale"),
                                                          ("policy", "host_tier"), ("policy", "host_eviction"),
                                                          ("policy", "host_write"),
                                                          ("model", "expert_routing"),
                                                          ("model", "expert_zipf_s"),
                                                          ("workload", "lengths_trace"))


def short_repr(value, limit: int = 80) -> str:
    """repr() on one line, cut to ``limit`` characters (an error message stays one readable line)."""
    r = ("true" if value else "false") if isinstance(value, bool) else repr(value)  # booleans as TOML writes them
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _field_name(loc: tuple) -> str:
    """The dotted scenario field of an error location (without pydantic's union-member suffixes)."""
    names, model = [], Scenario
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if isinstance(part, int) and names:  # an item of a list of tables, e.g. fleet.faults.0.replica
            names.append(str(part))
            continue
        if not isinstance(part, str) or fields is None or part not in fields:
            if not names or fields is not None:
                names.append(str(part))
            break
        names.append(part)
        model = _table_of(fields[part].annotation)
    return ".".join(names)


def _table_of(annotation):
    """The model inside ``Model | None`` or ``tuple[Model, ...]`` (else the annotation itself)."""
    if hasattr(annotation, "model_fields"):
        return annotation
    return next((a for a in getattr(annotation, "__args__", ()) if hasattr(a, "model_fields")), annotation)


def _format(err: ValidationError, source: str) -> str:
    e = err.errors()[0]
    field = _field_name(tuple(e["loc"]))
    if e["type"] == "extra_forbidden":
        return f"{source}: unknown field {field!r}"
    if e["type"] == "missing":  # its input is the table around it, not a value of the field
        return f"{source}: field {field}: missing (required)"
    if e["type"] == "model_type":
        return f"{source}: field {field} = {short_repr(e.get('input'))}: must be a table ([{field}])"
    msg = e["msg"].removeprefix("Value error, ")
    if msg.startswith("field ") and (not e["loc"] or e["type"] == "value_error"):  # a check across fields names its own
        return f"{source}: {msg}"
    return f"{source}: field {field} = {short_repr(e.get('input'))}: {msg}"


def parse_scenario(data: dict, source: str = "<scenario>", strict: bool = False) -> Scenario:
    """Validate a scenario dict. ``strict`` (files): no str/bool -> number or float -> int coercion."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a table, got {short_repr(data)}")
    try:
        return Scenario.model_validate(data, strict=strict)
    except ValidationError as err:
        raise ScenarioError(_format(err, source)) from None


# fields that only act together with others: (section, field, acts when ..., why it would not)
def _trace_arrivals(w) -> bool:
    return w.kind == "azure" or w.arrivals == "trace"


# fields whose effect hangs on other fields of the file alone (no command varies those): checked as the file is read
_INERT = (
    ("workload", "rate", lambda sc: not _trace_arrivals(sc.workload),
     "has no effect when arrivals come from the trace (kind = 'azure' or arrivals = 'trace'); "
     "scale the trace's timestamps with workload.time_scale instead"),
    ("workload", "time_scale", lambda sc: _trace_arrivals(sc.workload),
     "has no effect with Poisson arrivals (it divides trace timestamps); set workload.rate instead"),
    ("workload", "arrivals", lambda sc: sc.workload.kind != "azure" or sc.workload.arrivals == "trace",
     "has no effect with kind = 'azure' (a replay always uses the trace's timestamps)"),
    ("workload", "roles", lambda sc: sc.workload.kind != "azure", "has no effect with kind = 'azure' (no roles)"),
    ("workload", "prefix_len", lambda sc: sc.workload.kind != "azure",
     "has no effect with kind = 'azure' (no shared prefix)"),
    ("workload", "role_dist", lambda sc: sc.workload.kind != "azure", "has no effect with kind = 'azure' (no roles)"),
    ("workload", "zipf_s", lambda sc: sc.workload.kind != "azure" and sc.workload.role_dist == "zipf",
     "has no effect unless workload.role_dist = 'zipf'"),
    ("workload", "think_time_s", lambda sc: sc.workload.turns > 1, "has no effect unless workload.turns > 1"),
    ("workload", "followup_scale", lambda sc: sc.workload.turns > 1, "has no effect unless workload.turns > 1"),
    # Poisson arrivals draw lengths from lengths_trace: the arrival trace then only counts requests when
    # num_requests = 0 (granisim/core/workload.py, Workload.initial_specs)
    ("workload", "trace", lambda sc: (_trace_arrivals(sc.workload) or sc.workload.lengths_trace is None
                                      or sc.workload.num_requests == 0),
     "has no effect with Poisson arrivals, workload.lengths_trace set and workload.num_requests > 0 (lengths come "
     "from lengths_trace, arrivals from workload.rate)"),
    ("scheduler", "admission_max_wait_s", lambda sc: sc.scheduler.admission == "prefix",
     "has no effect unless scheduler.admission = 'prefix'"),
    # prefix admission puts first the waiters whose role prefix a running request holds; a replay has no roles,
    # so only its aging (admission_max_wait_s > 0) can reorder the queue (granisim/core/scheduler.py)
    ("scheduler", "admission", lambda sc: (sc.workload.kind != "azure" or sc.scheduler.admission == "fcfs"
                                           or sc.scheduler.admission_max_wait_s > 0),
     "has no effect with kind = 'azure' (no role prefixes to admit by; only scheduler.admission_max_wait_s > 0 "
     "would reorder the queue)"),
    ("model", "expert_zipf_s", lambda sc: sc.model.expert_routing == "zipf",
     "has no effect unless model.expert_routing = 'zipf'"),
    ("policy", "host_tier", lambda sc: sc.hardware.host_kv_gb > 0, "has no effect unless hardware.host_kv_gb > 0"),
    ("policy", "host_eviction", lambda sc: sc.hardware.host_kv_gb > 0,
     "has no effect unless hardware.host_kv_gb > 0"),
    ("policy", "host_write", lambda sc: sc.hardware.host_kv_gb > 0, "has no effect unless hardware.host_kv_gb > 0"),
    # with the KV budget given, memory shares size nothing; mem_fraction still bounds a tp > 1 shard's weights
    # (granisim/config/replica.py)
    ("hardware", "reserve_gb", lambda sc: sc.hardware.kv_budget_tokens is None,
     "has no effect when hardware.kv_budget_tokens is set (it only sizes the derived KV budget)"),
    ("hardware", "mem_fraction", lambda sc: sc.hardware.kv_budget_tokens is None or sc.hardware.tp > 1,
     "has no effect when hardware.kv_budget_tokens is set and hardware.tp = 1 (it sizes the derived KV budget, "
     "and with tp > 1 bounds a GPU's weight shard)"),
)


def replica_policies(sc) -> set[str]:
    """The policies some replica runs: [policy] name, or with [[fleet.groups]] each group's (its own or that one)."""
    groups = sc.fleet.groups if sc.fleet is not None else ()
    return {g.policy or sc.policy.name for g in groups} if groups else {sc.policy.name}


def _granikv(sc) -> bool:
    return "granikv" in replica_policies(sc)


# fields whose effect hangs on the policy or the router, which a command may choose per run (`compare --policies`
# or `--routers`, `capacity`, a sweep's grid): a file's value is refused where it acts in none of the command's
# runs (`granisim run`: the file as written), so a scenario written for granikv may run under token beside it
_INERT_BY_RUN = (
    ("policy", "hot_fraction", _granikv,
     "has no effect unless policy.name = 'granikv' (token and paged policies have no HOT pool), here or in a "
     "[[fleet.groups]] entry"),
    ("policy", "page_size", lambda sc: "paged" in replica_policies(sc),
     "has no effect unless policy.name = 'paged' (paged<N> names its own page size), here or in a "
     "[[fleet.groups]] entry"),
    ("policy", "dispatch", _granikv,
     "has no effect unless policy.name = 'granikv' (token and paged policies have no prefix pass to dispatch), "
     "here or in a [[fleet.groups]] entry"),
    ("policy", "m_sat", lambda sc: _granikv(sc) and sc.policy.dispatch == "threshold",
     "has no effect unless policy.dispatch = 'threshold' (the only rule that reads it) and policy.name = "
     "'granikv', here or in a [[fleet.groups]] entry"),
    ("fleet", "staleness_s", lambda sc: _router(sc) != "round_robin",
     "has no effect under fleet.router = 'round_robin' (it reads only which replicas are up, always live)"),
    ("fleet", "balance_abs", lambda sc: _router(sc) in ("cache_aware", "hot_aware"),
     "has no effect unless fleet.router is 'cache_aware' or 'hot_aware'"),
    ("fleet", "balance_rel", lambda sc: _router(sc) in ("cache_aware", "hot_aware"),
     "has no effect unless fleet.router is 'cache_aware' or 'hot_aware'"),
    ("fleet", "cache_threshold", lambda sc: _router(sc) == "cache_aware",
     "has no effect unless fleet.router = 'cache_aware'"),
    ("fleet", "load_factor", lambda sc: _router(sc) == "role_affinity",
     "has no effect unless fleet.router = 'role_affinity'"),
    ("fleet", "rebalance_every", lambda sc: _router(sc) == "hot_aware",
     "has no effect unless fleet.router = 'hot_aware'"),
)


def _router(sc) -> str:
    return sc.fleet.router if sc.fleet is not None else "round_robin"


def inert(dotted: str, sc: Scenario) -> str | None:
    """Why the field ``dotted`` (``section.name``) has no effect in ``sc``; None where it acts or always does."""
    return next((why for section, name, acts, why in _INERT + _INERT_BY_RUN
                 if f"{section}.{name}" == dotted and not acts(sc)), None)


def _refuse_written(data: dict, runs: list[Scenario], source: str, table, label: str = "",
                    skip: tuple[str, ...] = ()) -> None:
    """Refuse the first field of ``table`` written in ``data`` (a file's tables) that acts in none of ``runs``."""
    if not runs:
        return
    for section, name, _, _ in table:
        written = data.get(section)
        if not (isinstance(written, dict) and name in written) or f"{section}.{name}" in skip:
            continue
        whys = [inert(f"{section}.{name}", sc) for sc in runs]
        if all(whys):
            raise ScenarioError(f"{source}: field {section}.{name} = {short_repr(written[name])}: {whys[0]}{label}")


def check_effective(data: dict, sc: Scenario, source: str) -> None:
    """Reject a field the user wrote (in ``data``) that the resolved scenario ``sc`` would ignore whatever policy
    or router it runs under (``_INERT``)."""
    _refuse_written(data, [sc], source, _INERT)


def check_effective_in_runs(data: dict, runs: list[Scenario] | None, source: str, label: str = "",
                            skip: tuple[str, ...] = ()) -> None:
    """Reject a field the user wrote (in ``data``) whose effect hangs on the policy or router (``_INERT_BY_RUN``)
    and that acts in none of ``runs``: the scenarios a command runs of the file (``label`` says which, e.g.
    " (in every run of --policies token,paged16)"); None: no check (the command refuses its runs itself).
    ``skip``: fields every run sets anew (a sweep's varied fields), whose written value acts nowhere anyway."""
    if runs is not None:
        _refuse_written(data, runs, source, _INERT_BY_RUN, label, skip)


def scenario_runs(sc: Scenario, policies: list[str] | None = None,
                  routers: list[str] | None = None) -> list[Scenario] | None:
    """``sc`` under each of ``policies`` ([policy] name) x ``routers`` ([fleet] router), None standing for its
    own; None where one of them is not valid (the command then refuses it in its own words)."""
    runs = []
    for pol in policies or [None]:
        for router in routers or [None]:
            changes = {}
            if pol is not None:
                changes["policy.name"] = pol
            if router is not None and sc.fleet is not None:  # without [fleet] no router field was written
                changes["fleet.router"] = router
            try:
                runs.append(sc.with_changes(**changes) if changes else sc)
            except ScenarioError:
                return None
    return runs


def parse_scenario_file_data(data: dict, source: str, as_written: bool = True) -> Scenario:
    """A scenario as written in a file: strict types, and no field without effect. ``as_written=False``: the
    fields whose effect hangs on the policy or router are left to :func:`check_effective_in_runs` (a caller that
    runs the file under other policies or routers)."""
    sc = parse_scenario(data, source=source, strict=True)
    check_effective(data, sc, source)
    if as_written:
        check_effective_in_runs(data, [sc], source)
    return sc


def read_scenario(path: str | Path) -> tuple[Scenario, dict]:
    """A scenario file and its tables as written, every check made but those of the fields whose effect hangs on
    the policy or router: the caller runs it under its own and passes those runs to
    :func:`check_effective_in_runs`."""
    path = Path(path)
    data = read_toml(path, "scenario file")
    return parse_scenario_file_data(data, source=str(path), as_written=False), data


def load_scenario(path: str | Path) -> Scenario:
    """A scenario file run as written: no field the run would ignore."""
    sc, data = read_scenario(path)
    check_effective_in_runs(data, [sc], str(path))
    return sc


def read_toml(path: Path, what: str) -> dict:
    """A TOML file's table; unreadable, non-UTF-8 or invalid TOML -> one-line ScenarioError."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read {what} ({err.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark, as some editors write, is no mistake
    except UnicodeDecodeError as err:
        raise ScenarioError(f"{path}: {what} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset "
                            f"{err.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"{path}: not valid TOML ({' '.join(str(err).split())[:200]})") from None
