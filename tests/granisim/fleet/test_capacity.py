"""Fleet capacity: the fewest replicas that hold a rate within the SLO."""

import json

import pytest

from granisim.cli import main
from granisim.fleet.capacity import fewest_replicas

TOML = """name = "tiny"
seed = 2
[workload]
roles = 4
prefix_len = 2048
num_requests = 60
rate = 10.0
max_output_len = 32
[fleet]
router = "cache_aware"
"""


def test_fewest_replicas_bisects_a_monotone_test():
    asked = []

    def holds(n):
        asked.append(n)
        return n >= 5

    assert fewest_replicas(holds, 16) == 5
    assert len(asked) <= 5  # 16, then log2(16) halvings
    assert fewest_replicas(lambda n: False, 8) is None
    assert fewest_replicas(lambda n: True, 8) == 1


def test_cli_finds_more_replicas_for_a_higher_rate(tmp_path, capsys):
    path = tmp_path / "f.toml"
    path.write_text(TOML)
    got = {}
    for rate in (2.0, 80.0):
        out = tmp_path / f"r{rate:g}"
        assert main(["capacity", str(path), "--slo", "ttft_p99=0.5s", "--rate", str(rate), "--max-replicas", "6",
                     "--policies", "granikv", "--routers", "round_robin,cache_aware", "--workers", "1",
                     "--out", str(out)]) == 0
        res = json.loads((out / "fleet_capacity.json").read_text())["results"]
        got[rate] = {r["router"]: r["replicas"] for r in res}
        assert (out / "fleet_capacity.png").exists()
    assert "fewest replicas holding 80 req/s" in capsys.readouterr().out
    for router in ("round_robin", "cache_aware"):
        low, high = got[2.0][router], got[80.0][router]
        assert low is not None and (high is None or high > low), got


def test_cli_rejects_groups_and_bad_routers(tmp_path, capsys):
    path = tmp_path / "g.toml"
    path.write_text(TOML + "[[fleet.groups]]\nreplicas = 2\n")
    assert main(["capacity", str(path), "--slo", "ttft_p99=1s", "--rate", "5"]) == 2
    err = capsys.readouterr().err  # catches: the line named neither the file nor the field
    assert "remove [[fleet.groups]]" in err and err.startswith(f"error: {path}: field fleet.groups "), err
    path.write_text(TOML)
    assert main(["capacity", str(path), "--slo", "ttft_p99=1s", "--rate", "5", "--routers", "fastest"]) == 2
    assert "unknown router 'fastest'" in capsys.readouterr().err


def test_a_search_run_again_over_its_folder_resumes_from_the_kept_probes(tmp_path, monkeypatch, capsys):
    """A fleet capacity search kept every finished probe in OUT/probes.jsonl; run again over the same folder it
    simulates none of them and gives the same answer and probes. A probe cut short by a kill (a half-written last
    line) runs again, and a changed scenario (another rate) simulates afresh. Planted: keying a probe by router
    and policy alone (not the fleet size) gives a wrong answer on the second run."""
    import granisim.fleet.capacity as C

    path = tmp_path / "f.toml"
    path.write_text(TOML)
    simulated = []
    real_probe = C.probe
    monkeypatch.setattr(C, "probe", lambda sc: simulated.append(sc.fleet.replicas) or real_probe(sc))
    args = ["capacity", str(path), "--slo", "ttft_p99=0.5s", "--rate", "10", "--max-replicas", "6",
            "--policies", "granikv", "--routers", "round_robin", "--workers", "1", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    first = json.loads((tmp_path / "o" / "fleet_capacity.json").read_text())["results"]
    n_first = len(simulated)
    assert n_first >= 2 and len((tmp_path / "o" / "probes.jsonl").read_text().splitlines()) == n_first
    assert main(args) == 0
    assert len(simulated) == n_first and "kept in" in capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "fleet_capacity.json").read_text())["results"] == first
    log = tmp_path / "o" / "probes.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]) + "\n")  # the last probe cut short
    assert main(args) == 0 and len(simulated) == n_first + 1
    assert json.loads((tmp_path / "o" / "fleet_capacity.json").read_text())["results"] == first
    assert main(args[:5] + ["11"] + args[6:]) == 0 and len(simulated) > n_first + 1


def test_a_fleet_of_tensor_parallel_replicas_counts_every_gpu(tmp_path):
    """With hardware.tp = 2 each replica is two GPUs: the fleet's summary and the fewest-replicas search
    count GPUs as replicas x tp, not one per replica."""
    path = tmp_path / "tp.toml"
    path.write_text(TOML.replace("[workload]", "[hardware]\nprofile = \"h200\"\ntp = 2\n[workload]")
                    .replace("[fleet]", "[fleet]\nreplicas = 3"))
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["gpus"] == 6 and [r["tp"] for r in summary["replicas"]] == [2, 2, 2]
    out = tmp_path / "cap"
    assert main(["capacity", str(path), "--slo", "ttft_p99=5s", "--rate", "2", "--max-replicas", "2",
                 "--policies", "granikv", "--workers", "1", "--out", str(out)]) == 0
    (res,) = json.loads((out / "fleet_capacity.json").read_text())["results"]
    assert res["replicas"] is not None and res["gpus"] == 2 * res["replicas"]


@pytest.mark.parametrize("extra", [["--routers", "hot_aware"], ["--max-replicas", "4"]])
def test_fleet_size_options_without_rate_are_refused(tmp_path, capsys, extra):
    """catches: `capacity --routers R` (or --max-replicas) without --rate ran the rate search behind the scenario's
    own router and fleet size and said nothing of the option."""
    path = tmp_path / "f.toml"
    path.write_text(TOML)
    assert main(["capacity", str(path), "--slo", "ttft_p99=1s", *extra, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {extra[0]} {extra[1]}") and "--rate" in err[0], err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra", [["--lo", "2"], ["--hi", "30"], ["--rel-tol", "0.1"], ["--max-probes", "5"]])
def test_rate_search_options_with_rate_are_refused(tmp_path, capsys, extra):
    """The reverse: --lo, --hi, --rel-tol and --max-probes steer the rate search; with --rate R (the fewest
    replicas) they were dropped silently. catches: the option ignored (exit 0)."""
    path = tmp_path / "f.toml"
    path.write_text(TOML)
    assert main(["capacity", str(path), "--slo", "ttft_p99=1s", "--rate", "10", *extra,
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {extra[0]} {extra[1]}") and "rate search" in err[0], err
    assert not (tmp_path / "o").exists()


def test_fewest_replicas_searches_the_scenarios_policy_unless_told(tmp_path, capsys):
    """Without --policies the fleet search runs the scenario's policy alone, as it does its router. Planted: the
    rate search's default (granikv,token,paged16) made `capacity --rate` search three policies the scenario does
    not name."""
    path = tmp_path / "f.toml"
    path.write_text(TOML + "[policy]\nname = \"token\"\n")
    out = tmp_path / "o"
    assert main(["capacity", str(path), "--slo", "ttft_p99=5s", "--rate", "2", "--max-replicas", "2",
                 "--workers", "1", "--out", str(out)]) == 0
    res = json.loads((out / "fleet_capacity.json").read_text())["results"]
    assert [(r["router"], r["policy"]) for r in res] == [("cache_aware", "token")]


@pytest.mark.parametrize("args", [["compare", "--policies", "granikv,token,granikv"],
                                  ["compare", "--routers", "round_robin,hot_aware,round_robin"],
                                  ["capacity", "--slo", "ttft_p99=1s", "--policies", "token,token"],
                                  ["capacity", "--slo", "ttft_p99=1s", "--rate", "5", "--routers", "hot_aware,hot_aware"]])
def test_a_name_given_twice_is_refused(tmp_path, capsys, args):
    """Each name is one run: a name given twice is a typo for another, refused with one line. Planted: the
    comparison kept one run per name and said nothing of the second."""
    path = tmp_path / "f.toml"
    path.write_text(TOML.replace("[fleet]", "[fleet]\nreplicas = 2"))
    assert main([args[0], str(path), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert "given twice" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("workload, field", [
    ('kind = "azure"\nnum_requests = 20\n', "workload.kind = 'azure'"),
    ('roles = 2\nprefix_len = 256\nnum_requests = 20\narrivals = "trace"\n', "workload.arrivals = 'trace'")])
def test_a_trace_replay_is_refused_by_the_fewest_replicas_search(tmp_path, capsys, workload, field):
    """catches: every probe set workload.rate = R, which a trace replay ignores, so `--rate 3` on the Azure replay
    reported the fewest replicas 'holding 3 req/s' for the trace's own arrivals."""
    path = tmp_path / "az.toml"
    path.write_text(f"name = \"az\"\n[workload]\n{workload}[fleet]\nreplicas = 2\n")
    out = tmp_path / "o"
    assert main(["capacity", str(path), "--slo", "ttft_p99=2s", "--rate", "3", "--max-replicas", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {path}: field {field}: "), err
    assert "--rate 3" in err and not out.exists()


def test_faults_beyond_a_probe_are_named_not_dropped_silently(tmp_path, capsys):
    """A probe of n replicas keeps the faults of replicas below n: the search says so once. catches: faults of
    replica 2 left out of the 1- and 2-replica probes without a word."""
    path = tmp_path / "f.toml"
    path.write_text(TOML.replace("[fleet]", "[fleet]\nreplicas = 3") + "[[fleet.faults]]\nreplica = 2\nat_s = 1.0\n")
    assert main(["capacity", str(path), "--slo", "ttft_p99=5s", "--rate", "2", "--max-replicas", "3",
                 "--workers", "1", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert err.count("keeps the faults of replicas 0 .. n-1 only") == 1 and "up to 2" in err, err
