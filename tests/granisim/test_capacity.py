"""Capacity search: SLO parsing with units; bisection finds a known answer."""

import json
import math

import pytest

from granisim.experiments.capacity import meets, parse_slo, search
from granisim.cli import main
from granisim.config.scenario import ScenarioError


def test_parse_slo_units():
    assert parse_slo("ttft_p99=2s,tpot_p99=100ms") == {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}
    got = parse_slo("e2e_p50=1.5min, queue_p50=250us,ttft_p50_s=0.5")
    assert got == pytest.approx({"e2e_p50_s": 90.0, "queue_p50_s": 250e-6, "ttft_p50_s": 0.5})
    assert parse_slo("ttft_p99_s=3") == {"ttft_p99_s": 3.0}


@pytest.mark.parametrize("bad", ["ttft_p99=2parsecs", "goodput=3s", "ttft_p99", "", "ttft_p99=0s",
                                 "tpot_p99=100"])  # no unit: was 100 s where 100 ms was meant
def test_parse_slo_rejects(bad):
    with pytest.raises(ScenarioError):
        parse_slo(bad)


@pytest.mark.parametrize("bad, why", [
    ("ttft_p99=1s,tpot_p99=50ms,ttft_p99=2s", "ttft_p99 given twice"),  # was: the 2 s limit, silently
    ("ttft_p99=1s,ttft_p99_s=2", "ttft_p99 given twice"),
    ("ttft_p99=1e400s", "must be a finite number"),  # was: a limit of inf, met by every probe
])
def test_parse_slo_refuses_what_it_would_silently_change(bad, why):
    with pytest.raises(ScenarioError, match=why):
        parse_slo(bad)


def _queue(capacity: float, base: float):
    """An M/M/1-like stub: p99 latency = base / (1 - rate / capacity), infinite at or above capacity."""
    calls = []

    def probe(rate):
        calls.append(rate)
        p = base / (1 - rate / capacity) if rate < capacity else math.inf
        return {"ttft_p99_s": p, "tpot_p99_s": base / 10, "requests": 10, "completed": 10, "rejected": 0,
                "throughput_rps": min(rate, capacity)}

    return probe, calls


@pytest.mark.parametrize("lo,hi", [(0.5, 2.0), (0.01, 0.05), (30.0, 90.0)])
def test_bisection_finds_the_known_answer(lo, hi):
    # ttft_p99 <= 2 s with base 0.5 s and capacity 10 req/s  <=>  rate <= 10 * (1 - 0.5 / 2) = 7.5
    probe, calls = _queue(10.0, 0.5)
    res = search(probe, {"ttft_p99_s": 2.0}, lo, hi, rel_tol=0.001, max_probes=60)
    assert res.rate <= 7.5 < res.upper
    assert (res.upper - res.rate) / res.upper <= 0.001
    assert res.rate == pytest.approx(7.5, rel=0.002)
    assert len(res.probes) == len(calls) and not res.note


def test_two_limits_the_tighter_binds():
    probe, _ = _queue(10.0, 0.5)
    # tpot = 0.05 always passes 0.1 s; ttft 1 s binds at 10 * (1 - 0.5) = 5
    res = search(probe, {"ttft_p99_s": 1.0, "tpot_p99_s": 0.1}, 1.0, 4.0, rel_tol=0.001, max_probes=60)
    assert res.rate == pytest.approx(5.0, rel=0.002)


def test_unreachable_and_unbounded():
    probe, _ = _queue(10.0, 5.0)
    res = search(probe, {"ttft_p99_s": 1.0}, 1.0, 4.0, max_probes=30)  # even rate -> 0 gives 5 s
    assert res.rate == 0.0 and "not met" in res.note
    probe, _ = _queue(1e9, 0.001)
    res = search(probe, {"ttft_p99_s": 1.0}, 1.0, 2.0, max_probes=5)
    assert res.rate == 32.0 and "capacity is higher" in res.note


def test_rejections_fail_the_slo():
    assert not meets({"ttft_p99_s": 0.1, "rejected": 1, "requests": 5, "completed": 4}, {"ttft_p99_s": 1.0})
    assert not meets({"ttft_p99_s": float("nan"), "requests": 0, "completed": 0}, {"ttft_p99_s": 1.0})


def test_a_figure_no_request_has_is_refused_not_failed(tmp_path, capsys):
    """Every output one token: no request has a TPOT at any rate, so a TPOT limit cannot be judged. One line naming
    it, exit 2, for one GPU and for a fleet. Planted bug: NaN read as a failed probe answered 'SLO not met even at
    1.2e-06 req/s' (exit 0), a capacity of zero the workload never showed."""
    with pytest.raises(ScenarioError, match="tpot_p99_s"):
        meets({"tpot_p99_s": float("nan"), "requests": 5, "completed": 5}, {"tpot_p99_s": 0.1})
    body = "[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 10\nrate = 8.0\nmax_output_len = 1\n"
    for name, text in (("one", body), ("fleet", body + "[fleet]\nreplicas = 2\n")):
        sc = tmp_path / f"{name}.toml"
        sc.write_text(text)
        assert main(["capacity", str(sc), "--slo", "ttft_p99=2s,tpot_p99=100ms", "--out", str(tmp_path / name),
                     "--workers", "1", *(["--policies", "granikv"] if name == "one" else [])]) == 2
        err = capsys.readouterr().err.strip()  # the probes' progress lines, then the error
        assert "Traceback" not in err and err.splitlines()[-1].startswith("error: --slo tpot_p99_s"), err
        assert sum(line.startswith("error:") for line in err.splitlines()) == 1
    # a TTFT limit alone is judged as before
    assert main(["capacity", str(tmp_path / "one.toml"), "--slo", "ttft_p99=2s", "--policies", "granikv",
                 "--out", str(tmp_path / "ttft"), "--workers", "1", "--rel-tol", "0.2"]) == 0


def test_capacity_cli_on_the_simulator(tmp_path, capsys):
    sc = tmp_path / "s.toml"
    sc.write_text("[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 30\nrate = 8.0\nmax_output_len = 16\n")
    out = tmp_path / "cap"
    assert main(["capacity", str(sc), "--slo", "ttft_p99=500ms", "--policies", "granikv,token", "--out", str(out),
                 "--rel-tol", "0.1", "--workers", "1"]) == 0
    data = json.loads((out / "capacity.json").read_text())
    assert [r["policy"] for r in data["results"]] == ["granikv", "token"]
    for r in data["results"]:
        passing = [p["rate"] for p in r["probes"] if p["ok"]]
        assert r["max_rate"] == max(passing) > 0
        assert all(p["ttft_p99_s"] <= 0.5 for p in r["probes"] if p["ok"])
    assert (out / "capacity.png").exists()
    assert main(["capacity", str(sc), "--slo", "ttft_p99=2furlongs"]) == 2


def test_a_rate_search_run_again_over_its_folder_simulates_nothing(tmp_path, monkeypatch, capsys):
    """The rate search keeps its probes in OUT/probes.jsonl: run again over the same folder, the same answer from
    no simulation; with another policy list only the new policy's probes run."""
    import granisim.experiments.sweep as S

    sc = tmp_path / "s.toml"
    sc.write_text("[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 30\nrate = 8.0\nmax_output_len = 16\n")
    calls = []
    real = S.simulate_scenario
    monkeypatch.setattr(S, "simulate_scenario", lambda s: calls.append(s.policy.name) or real(s))
    args = ["capacity", str(sc), "--slo", "ttft_p99=500ms", "--policies", "granikv", "--out", str(tmp_path / "c"),
            "--rel-tol", "0.1", "--workers", "1"]
    assert main(args) == 0
    first, n = json.loads((tmp_path / "c" / "capacity.json").read_text())["results"], len(calls)
    assert n >= 3
    assert main(args) == 0 and len(calls) == n
    assert json.loads((tmp_path / "c" / "capacity.json").read_text())["results"] == first
    assert main(args[:5] + ["granikv,token"] + args[6:]) == 0
    assert set(calls[n:]) == {"token"}


def test_a_probe_written_after_a_cut_line_is_kept(tmp_path):
    """A kill can cut the last line of probes.jsonl mid-write (no newline). The next probe's line must start anew,
    or it joins the cut one and is lost again on the following resume. catches: appending straight after the
    cut line (the new probe read back as missing)."""
    from granisim.config.scenario import parse_scenario
    from granisim.experiments.probes import ProbeLog

    a, b, c = (parse_scenario({"seed": s}) for s in (1, 2, 3))
    log = ProbeLog(tmp_path)
    log.run(a, lambda: {"x": 1})
    log.run(b, lambda: {"x": 2})
    path = tmp_path / "probes.jsonl"
    path.write_text(path.read_text()[:-20])  # b's line cut short, as a kill leaves it
    again = ProbeLog(tmp_path)
    assert again.run(a, lambda: {"x": -1}) == ({"x": 1}, False)
    assert again.run(c, lambda: {"x": 3}) == ({"x": 3}, True)
    last = ProbeLog(tmp_path)
    assert last.run(c, lambda: {"x": -1}) == ({"x": 3}, False)
    assert last.run(b, lambda: {"x": 2}) == ({"x": 2}, True)


def test_a_finished_search_leaves_its_probes_in_one_order(tmp_path):
    """catches: parallel policy (or router) searches append to probes.jsonl as their probes finish, so the same
    capacity command run twice left the same probes in different orders (the output folders differed)."""
    from granisim.config.scenario import parse_scenario
    from granisim.experiments.probes import ProbeLog, tidy

    scs = [parse_scenario({"seed": s}) for s in (1, 2, 3)]
    for name, order in (("one", [0, 1, 2]), ("two", [2, 0, 1])):
        log = ProbeLog(tmp_path / name)
        for i in order:
            log.run(scs[i], lambda i=i: {"x": i}, f"granikv {i} req/s")
    (tmp_path / "two" / "probes.jsonl").write_text((tmp_path / "two" / "probes.jsonl").read_text() + '{"key": "cu')
    for name in ("one", "two"):
        tidy(tmp_path / name)
    assert (tmp_path / "one" / "probes.jsonl").read_bytes() == (tmp_path / "two" / "probes.jsonl").read_bytes()
    again = ProbeLog(tmp_path / "two")  # still the resume log: every probe kept
    assert [again.run(sc, lambda: {"x": -1}) for sc in scs] == [({"x": i}, False) for i in range(3)]


def test_the_rate_search_blames_kind_for_the_azure_replay(tmp_path, capsys):
    """catches: the line named `workload.arrivals = 'poisson'`, the default the replay ignores, as the culprit,
    instead of `workload.kind = 'azure'`."""
    sc = tmp_path / "az.toml"
    sc.write_text('name = "az"\n[workload]\nkind = "azure"\nnum_requests = 10\n')
    assert main(["capacity", str(sc), "--slo", "ttft_p99=2s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {sc}: field workload.kind = 'azure': capacity searches the Poisson rate"), err


@pytest.mark.parametrize("given, want", [
    # catches: the error named the default it had filled in as if typed, "--lo 20 / --hi 10" for `--lo 20` alone
    (["--lo", "20"], "--lo 20 / --hi 10 (default: workload.rate 5 x 2): need 0 < lo < hi"),
    (["--hi", "0.5"], "--lo 0.625 (default: workload.rate 5 / 8) / --hi 0.5: need 0 < lo < hi"),
    (["--lo", "10", "--hi", "5"], "--lo 10 / --hi 5: need 0 < lo < hi"),
])
def test_rate_bounds_out_of_order_name_the_default_as_a_default(tmp_path, capsys, given, want):
    from tests.granisim.cli_errors import one_line_error

    sc = tmp_path / "s.toml"
    sc.write_text("[workload]\nroles = 2\nprefix_len = 512\nnum_requests = 5\nrate = 5.0\n")
    rc = main(["capacity", str(sc), "--slo", "ttft_p99=2s", "--policies", "granikv", *given,
               "--out", str(tmp_path / "o")])
    assert one_line_error(capsys, rc).endswith(want)
    assert not (tmp_path / "o").exists()
