"""The host-memory KV tier (granisim/kv/host_tier.py): write-back, prefetch, host eviction, pricing, bad input."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
import sys

import numpy as np
import pytest

from granisim.config.hardware import get_profile
from granisim.config.scenario import ScenarioError, parse_scenario_file_data
from granisim.costmodel.transfers import copy_seconds, copy_stream_seconds, exposed_seconds
from granisim.kv.allocator import make_allocator
from granisim.config.models import get_model
from granisim.kv.host_tier import HostTierConfig, KVTransfer, host_tier_config

BPT = 1000  # bytes per token in these tests


def _prompt(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 50_000, n).astype(np.int64)


def _serve(a, rid: int, tokens: np.ndarray, shared: int) -> int:
    """Admit, compute and finish one request; returns the cached length at admission."""
    cached = a.admit(rid, tokens, shared)
    a.extend(rid, tokens.size - cached)
    a.cache_prefix(rid, tokens[:shared])
    a.release(rid, tokens)
    return cached


def _granikv(host_tokens=10_000, mode="slabs", eviction="lru", capacity=2_000):
    return make_allocator("granikv", capacity, hot_fraction=0.5,
                          host=HostTierConfig(host_tokens, BPT, mode, eviction))


def test_off_has_no_tier_and_no_transfers():
    a = make_allocator("granikv", 1000, hot_fraction=0.5)
    assert a.host_tier is None and a.eviction.host is None
    p = _prompt(0, 300)
    _serve(a, 1, p, 256)
    a.clear_cache()
    assert a.take_transfers() == []


def test_slab_goes_to_host_and_comes_back_as_one_copy():
    a = _granikv()
    p = _prompt(1, 600)
    assert _serve(a, 1, p, 512) == 0
    a.take_transfers()
    a.clear_cache()  # the slab is evicted: written back, one contiguous copy
    out = a.take_transfers()
    hot = [t for t in out if t.contiguous]
    assert len(hot) == 1 and hot[0].direction == "to_host" and hot[0].tokens == 512 and hot[0].pieces == 1
    assert hot[0].nbytes == 512 * BPT
    assert a.radix.match_prefix(p).length == 0  # gone from the GPU index
    q = np.concatenate([p[:512], _prompt(2, 50)])
    cached = a.admit(2, q, 512)  # prefetched instead of recomputed
    assert cached == 512
    back = a.take_transfers()
    assert [(t.direction, t.contiguous, t.tokens) for t in back] == [("to_gpu", True, 512)]
    assert np.array_equal(back[0].host_slots, hot[0].host_slots)
    # the radix node is restored: another request matches the prefix on the GPU
    assert a.radix.match_prefix(q, 512).length == 512
    assert a.layout(2) is not None and a.num_tokens(2) == 512


def test_evicting_a_prefetched_run_again_moves_nothing():
    a = _granikv()
    p = _prompt(3, 600)
    _serve(a, 1, p, 512)
    a.clear_cache()
    _serve(a, 2, p, 512)
    a.take_transfers()
    before = a.host_tier.bytes_in
    a.clear_cache()
    assert a.take_transfers() == []  # the host already holds the slab ('slabs': COLD pages are not kept)
    assert a.host_tier.bytes_in == before


def test_reused_writes_back_only_runs_read_since_they_were_cached():
    """Request 2 reads request 1's 256-token prefix; both leave their own tokens cached (344 and 100 tokens that
    nobody reads). Evicting everything writes back all 700 tokens under "all", and only the prefix under
    "reused" (the two unread runs are skipped), which still comes back for a third request."""
    moved = {}
    for write in ("all", "reused"):
        a = make_allocator("token", 2_000, host=HostTierConfig(10_000, BPT, "slabs+pages", "lru", write))
        p = _prompt(4, 600)
        q = np.concatenate([p[:256], _prompt(5, 100)])
        _serve(a, 1, p, 256)
        _serve(a, 2, q, 256)
        a.take_transfers()
        a.clear_cache()
        out = a.take_transfers()
        moved[write] = (sum(t.tokens for t in out if t.direction == "to_host"), a.host_tier.write_skips)
        assert a.host_tier.bytes_in == moved[write][0] * BPT
        r = np.concatenate([p[:256], _prompt(6, 40)])
        assert a.admit(3, r, 256) == 256  # the prefix is prefetched under either
    assert moved == {"all": (700, 0), "reused": (256, 2)}


def test_a_split_run_keeps_its_reads():
    """A run split by a partial match: the head keeps the reads the whole run had, and the match counts on it."""
    from granisim.kv.radix import RadixIndex

    r = RadixIndex()
    t = np.arange(10, dtype=np.int64)
    r.insert(t, np.arange(10), "cold")
    r.match_prefix(t)
    head = r.match_prefix(np.array([0, 1, 2, 3, 99])).node  # splits the run after 4 tokens
    assert len(head) == 4 and head.hits == 2 and next(iter(head.children.values())).hits == 1


def test_token_policy_moves_pages():
    a = make_allocator("token", 2_000, host=HostTierConfig(10_000, BPT, "slabs+pages", "lru"))
    b = make_allocator("paged16", 2_000, host=HostTierConfig(10_000, BPT, "slabs+pages", "lru"))
    for alloc in (a, b):
        p = _prompt(4, 600)
        _serve(alloc, 1, p, 512)
        alloc.take_transfers()
        alloc.clear_cache()
        out = alloc.take_transfers()
        assert out and not any(t.contiguous for t in out)
        assert sum(t.tokens for t in out) == alloc.host_tier.bytes_in // BPT
        cached = alloc.admit(2, p, 512)
        back = alloc.take_transfers()
        assert cached == back[0].tokens and back[0].direction == "to_gpu" and not back[0].contiguous
        runs = 1 + int(np.count_nonzero(np.diff(back[0].host_slots) != 1))
        assert back[0].pieces == runs
        assert cached >= 512 - alloc.page_size and alloc.radix.match_prefix(p).length >= cached


def test_host_bytes_are_accounted_under_host_pressure():
    a = _granikv(host_tokens=1_100)  # room for two 512-token slabs, not three
    prompts = [_prompt(10 + i, 600) for i in range(4)]
    for i, p in enumerate(prompts):
        _serve(a, i, p, 512)
        a.clear_cache()
    ht = a.host_tier
    assert ht.bytes_dropped > 0
    assert ht.bytes_in == ht.bytes_dropped + ht.resident_bytes
    used = a.host_tier.pool.used
    held = sum(len(n) for n in ht.index.nodes())
    assert used == held  # every used host slot belongs to exactly one host node


def test_next_use_keeps_the_role_expected_soonest():
    """Role A comes every other admission, role B came once long ago: under next_use B's slab goes
    first when host memory is full; under LRU the older of the two goes, whichever it is."""
    results = {}
    for policy in ("lru", "next_use"):
        a = _granikv(host_tokens=1_100, eviction=policy)
        pa, pb, pc = _prompt(20, 600), _prompt(21, 600), _prompt(22, 600)
        rid = 0
        for p in (pb, pa, pa, pa, pa):  # B once, then A often (its host copy refreshed by each admission)
            rid += 1
            _serve(a, rid, p, 512)
            a.clear_cache()
        # A was last touched most recently; make B the most recent host use so that LRU would drop A
        rid += 1
        _serve(a, rid, pb, 512)
        a.clear_cache()
        rid += 1
        _serve(a, rid, pc, 512)  # a third slab: host must drop one
        a.clear_cache()
        ht = a.host_tier
        results[policy] = (ht.match(pa, 599)[0] >= 512, ht.match(pb, 599)[0] >= 512)
    assert results["lru"] == (False, True)
    assert results["next_use"] == (True, False)


def test_slab_copy_is_cheaper_than_pages_and_overlap_hides_it():
    prof = get_profile("h200")
    n = 16384 * 131072
    slab = copy_seconds(n, True, 1, prof)
    pages = copy_seconds(n, False, 16384, prof)
    assert slab < pages
    assert slab == pytest.approx(prof["host.copy_launch_s"] + n / prof["host.link_bandwidth"])
    t = [KVTransfer("to_gpu", np.arange(4), np.arange(4), n, True, 1),
         KVTransfer("to_host", np.arange(4), np.arange(4), n // 2, True, 1)]
    assert copy_stream_seconds(t, prof) == pytest.approx(slab)  # the directions run at once
    assert exposed_seconds(slab, slab / prof["host.overlap"], prof) == pytest.approx(0.0)
    assert exposed_seconds(slab, 0.0, prof) == pytest.approx(slab)


def test_one_copy_stream_adds_the_directions():
    """h200-engine's engine runs both directions on one stream (host.duplex = 0): their sum; half duplex: half
    of the faster direction overlaps."""
    eng = get_profile("h200-engine")
    assert eng["host.duplex"] == 0.0 and get_profile("h200")["host.duplex"] == 1.0
    t = [KVTransfer("to_gpu", np.arange(4), np.arange(4), 1 << 28, True, 1),
         KVTransfer("to_host", np.arange(4), np.arange(4), 1 << 27, False, 3)]
    a, b = (copy_seconds(x.nbytes, x.contiguous, x.pieces, eng, x.direction) for x in t)
    assert copy_stream_seconds(t, eng) == pytest.approx(a + b)
    c = eng.coefficients["host.duplex"]
    half = replace(eng, coefficients={**eng.coefficients, "host.duplex": replace(c, value=0.5)})
    assert copy_stream_seconds(t, half) == pytest.approx(max(a, b) + 0.5 * min(a, b))


def test_old_profiles_load_with_defaults():
    prof = get_profile("h100-sxm")  # no host link measured there: the defaults, page gathers at the link's rate
    assert prof["host.link_bandwidth"] > 0 and 0 < prof["host.overlap"] <= 1
    assert prof["host.page_bandwidth_to_gpu"] == 0.0
    n = 1 << 30
    assert copy_seconds(n, False, 0, prof, "to_gpu") == pytest.approx(n / prof["host.link_bandwidth"])
    h200 = get_profile("h200")
    assert h200.coefficients["host.link_bandwidth"].source.kind == "measured"


def test_page_gathers_move_at_their_directions_measured_rate():
    prof = get_profile("h200")
    n = 16384 * 131072
    for d in ("to_gpu", "to_host"):
        bw = prof[f"host.page_bandwidth_{d}"]
        assert 0 < bw < prof["host.link_bandwidth"]
        assert copy_seconds(n, False, 1024, prof, d) == pytest.approx(1024 * prof["host.page_copy_s"] + n / bw)
    t = [KVTransfer("to_gpu", np.arange(4), np.arange(4), n, False, 1024)]
    assert copy_stream_seconds(t, prof) == pytest.approx(copy_seconds(n, False, 1024, prof, "to_gpu"))


# ---- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("data, needle", [
    ({"hardware": {"host_kv_gb": -1.0}}, "hardware.host_kv_gb = -1.0"),
    ({"hardware": {"host_kv_gb": float("nan")}}, "hardware.host_kv_gb = nan"),
    ({"hardware": {"host_kv_gb": 64.0}, "policy": {"name": "token", "host_tier": "slabs"}},
     "policy.host_tier = 'slabs'"),
    ({"hardware": {"host_kv_gb": 64.0}, "policy": {"hot_fraction": 0.0, "host_tier": "slabs"}},
     "policy.host_tier = 'slabs'"),
    ({"policy": {"host_eviction": "next_use"}}, "policy.host_eviction = 'next_use'"),
    ({"policy": {"host_tier": "pages"}}, "policy.host_tier = 'pages'"),
    ({"policy": {"host_write": "reused"}}, "policy.host_write = 'reused'"),
    ({"hardware": {"host_kv_gb": 8.0}, "policy": {"host_write": "hits"}}, "policy.host_write = 'hits'"),
])
def test_bad_host_tier_input_is_one_line(data, needle):
    with pytest.raises(ScenarioError) as err:
        parse_scenario_file_data(data, "f.toml")
    msg = str(err.value)
    assert msg.startswith("f.toml: field ") and needle in msg and "\n" not in msg


@pytest.mark.parametrize("policy, mode", [({}, "slabs"), ({"hot_fraction": "adaptive"}, "slabs"),
                                          ({"hot_fraction": 0.0}, "slabs+pages"), ({"name": "token"}, "slabs+pages"),
                                          ({"name": "paged16"}, "slabs+pages"),
                                          ({"name": "token", "host_tier": "slabs+pages"}, "slabs+pages"),
                                          ({"host_tier": "slabs+pages"}, "slabs+pages")])
def test_an_unset_host_tier_moves_what_the_policy_keeps(policy, mode):
    """catches: the default 'slabs' made every token / paged run of a host-tier scenario fail (`granisim compare`
    over the default policies refused a granikv scenario with a tier, naming a field the user never wrote)."""
    sc = parse_scenario_file_data({"hardware": {"host_kv_gb": 8.0}, "policy": policy}, "f.toml")
    assert sc.policy.host_tier_mode == mode
    assert host_tier_config(sc, get_model("llama-3.1-8b")).mode == mode


def test_compare_runs_a_tier_scenario_under_every_default_policy(tmp_path, capsys):
    """catches: `granisim compare` of a granikv scenario with a host tier (host_tier unset) refused the token run,
    naming `policy.host_tier = 'slabs'`, a field the user never wrote."""
    from granisim.cli import main

    f = tmp_path / "s.toml"
    f.write_text("[hardware]\nhost_kv_gb = 1\nkv_budget_tokens = 20000\n[workload]\nnum_requests = 60\nroles = 8\n"
                 "prefix_len = 2000\nrate = 20\nmax_output_len = 16\n")
    assert main(["compare", str(f), "--out", str(tmp_path / "o")]) == 0, capsys.readouterr().err
    assert {"granikv", "token", "paged16"} <= set(json.loads((tmp_path / "o" / "compare.json").read_text()))


def test_bad_host_tier_input_exits_2(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[hardware]\nhost_kv_gb = 64\n[policy]\nname = "paged16"\nhost_tier = "slabs"\n')
    out = subprocess.run([sys.executable, "-m", "granisim.cli", "run", str(f)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and f"{f}: field policy.host_tier = 'slabs'" in out.stderr


@pytest.mark.parametrize("gb", [1e300, 2 ** 31, 9e3])
def test_a_host_tier_past_what_the_simulator_tracks_is_one_line(gb):
    """Host memory for more than MAX_HOST_TOKENS tokens (here 9 TB of Llama-3.1-8B's 131 KB a token, or values
    whose token count overflows to inf) is refused at setup naming the field, instead of an allocation of its slot
    bookkeeping failing (119 TiB at 2^31 GB) or a NaN token count."""
    from granisim.experiments.run import prepare
    from granisim.kv.host_tier import MAX_HOST_TOKENS

    sc = parse_scenario_file_data({"hardware": {"host_kv_gb": gb}}, "f.toml")
    with pytest.raises(ScenarioError) as err:
        prepare(sc, "f.toml")
    msg = str(err.value)
    assert msg.startswith(f"f.toml: field hardware.host_kv_gb = {float(gb)}") and str(MAX_HOST_TOKENS) in msg
    assert "\n" not in msg
    prepare(parse_scenario_file_data({"hardware": {"host_kv_gb": 8e3}}, "f.toml"), "f.toml")  # 61M tokens: fits



@pytest.mark.parametrize("gb", [1e-12, 5e-324])
def test_a_host_tier_of_less_than_one_token_is_one_line(gb):
    """catches: host_kv_gb = 1e-12 (> 0: a tier asked for, with its host_tier / host_write fields accepted) rounded
    down to 0 tokens and the run went on silently without a tier."""
    from granisim.experiments.run import prepare

    sc = parse_scenario_file_data({"hardware": {"host_kv_gb": gb}, "policy": {"host_write": "reused"}}, "f.toml")
    with pytest.raises(ScenarioError) as err:
        prepare(sc, "f.toml")
    msg = str(err.value)
    assert msg.startswith(f"f.toml: field hardware.host_kv_gb = {gb}: less than one token") and "\n" not in msg
    prepare(parse_scenario_file_data({"hardware": {"host_kv_gb": 131072e-9}}, "f.toml"), "f.toml")  # one token


def test_a_hot_pool_of_no_tokens_is_refused_with_a_slabs_tier():
    """catches: hot_fraction = 1e-9 of a 5,000-token budget is a HOT pool of 0 tokens, so host_tier = 'slabs' had
    nothing to move, as with hot_fraction = 0 (refused), but the run went on silently, its host_copy_s 0."""
    from granisim.experiments.run import prepare

    data = {"hardware": {"host_kv_gb": 1.0, "kv_budget_tokens": 5000}, "policy": {"hot_fraction": 1e-9},
            "workload": {"prefix_len": 100}}
    with pytest.raises(ScenarioError) as err:
        prepare(parse_scenario_file_data(data, "f.toml"), "f.toml")
    assert str(err.value).startswith("f.toml: field policy.hot_fraction = 1e-09: a HOT pool of 0 of 5000 tokens")
    data["policy"]["hot_fraction"] = 0.01  # 50 tokens: a pool, if smaller than the prefix
    prepare(parse_scenario_file_data(data, "f.toml"), "f.toml")
    data["policy"] = {"hot_fraction": 1e-9, "host_tier": "slabs+pages"}  # pages go to host: the tier acts
    prepare(parse_scenario_file_data(data, "f.toml"), "f.toml")

def test_tier_off_dumps_as_before():
    sc = parse_scenario_file_data({"hardware": {"host_kv_gb": 0.0}}, "f.toml")
    d = sc.model_dump()
    assert "host_kv_gb" not in d["hardware"] and "host_tier" not in d["policy"]
    assert "host_write" not in parse_scenario_file_data({"hardware": {"host_kv_gb": 8.0}}, "f").model_dump()["policy"]
    on = parse_scenario_file_data({"hardware": {"host_kv_gb": 8.0},
                                   "policy": {"host_eviction": "next_use", "host_write": "reused"}}, "f")
    assert on.model_dump()["policy"]["host_eviction"] == "next_use"
    assert on.model_dump()["policy"]["host_write"] == "reused"


def test_the_step_log_keeps_the_host_copy_time():
    """With a tier, the steps frame has t_host_copy (what the copy stream adds to a step) and the parts add up to
    each step's duration; without one its columns are as before. Planted: recording BREAKDOWN_KEYS only (the
    host copy time dropped) fails the sum."""
    from granisim.config.scenario import parse_scenario
    from granisim.core.metrics import BREAKDOWN_KEYS
    from granisim.experiments.run import prepare, simulate

    # h200-engine: no copy hidden behind compute, so every step that moves KV shows it
    base = {"seed": 3, "hardware": {"profile": "h200-engine", "kv_budget_tokens": 6000},
            "policy": {"name": "granikv", "host_tier": "slabs+pages"},
            "workload": {"kind": "multi_agent", "roles": 6, "prefix_len": 1024, "num_requests": 60, "rate": 50.0,
                         "max_output_len": 16}}
    with_tier = simulate(prepare(parse_scenario({**base, "hardware": {**base["hardware"], "host_kv_gb": 8.0}})))
    steps = with_tier.steps.frame()
    parts = [f"t_{k}" for k in (*BREAKDOWN_KEYS, "host_copy")]
    assert steps.t_host_copy.sum() > 0
    assert np.allclose(steps[parts].sum(axis=1), steps.duration_s, rtol=1e-9, atol=1e-12)
    off = simulate(prepare(parse_scenario({**base, "policy": {"name": "granikv"}}))).steps.frame()
    assert [c for c in off.columns if c.startswith("t_")] == [f"t_{k}" for k in BREAKDOWN_KEYS]
    # the summary totals it with a tier, and has no such field without one
    from granisim.core.metrics import requests_frame, summarize

    def summary(res):
        return summarize(requests_frame(res.records), res.steps.frame(), res.end_s)

    assert summary(with_tier)["host_copy_s"] == steps.t_host_copy.sum()
    assert "host_copy_s" not in summary(simulate(prepare(parse_scenario({**base, "policy": {"name": "granikv"}}))))


def test_validation_prices_a_steps_transfers_as_the_simulator_does():
    """step_cost (what `granisim validate` pairs with each real step) includes the host-tier copies the cost
    executor adds, and the validation columns fold them into kv_copy, where the engine times its copies and
    transfers together. h200-engine hides none of them (the engine serializes its copies), h200 hides 80%.
    Planted: step_cost without the transfers fails the first assertion."""
    from granisim.config.models import get_model
    from granisim.config.scenario import parse_scenario
    from granisim.costmodel import step_cost
    from granisim.costmodel.executor import CostExecutor
    from granisim.experiments.run import prepare, simulate
    from granisim.validation.validate import _columns

    sc = parse_scenario({"seed": 3, "hardware": {"profile": "h200-engine", "kv_budget_tokens": 6000, "host_kv_gb": 8.0},
                         "policy": {"name": "granikv", "host_tier": "slabs+pages"},
                         "workload": {"kind": "multi_agent", "roles": 6, "prefix_len": 1024, "num_requests": 60,
                                      "rate": 50.0, "max_output_len": 16}})
    setup = prepare(sc)
    plans = []

    class Keep(CostExecutor):
        def execute(self, plan):
            plans.append(plan)
            return super().execute(plan)

    simulate(setup, Keep(setup.profile, setup.model))
    moving = [p for p in plans if p.transfers]
    assert moving
    m = get_model("llama-3.1-8b")
    for p in moving:
        got, sim = step_cost(p, setup.profile, m), CostExecutor(setup.profile, m).execute(p)
        assert got.duration_s == sim.duration_s and got.breakdown["host_copy"] > 0
        cols = _columns("predicted", got)
        assert cols["predicted_kv_copy"] == pytest.approx(got.breakdown["kv_copy"] + got.breakdown["host_copy"])
    assert get_profile("h200-engine")["host.overlap"] == 0.0 and get_profile("h200")["host.overlap"] == 0.749
