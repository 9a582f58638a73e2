"""The simulated fleet on the real fleet's routing: each replica judged on the requests it served.

The router decides from each run's own live state, so in a validation run the simulated fleet may
send a request elsewhere than the real one did (``cache_aware`` does, from load differences of a few
percent). Fleet-wide figures do not depend on that; per-replica figures then compare different work.
Here the simulated fleet runs again with every request sent where the real router sent it
(granisim.fleet.routers.replay), and the end-to-end errors are taken fleet-wide and per replica.
"""
from __future__ import annotations

import pandas as pd

from granisim.core.metrics import summarize
from granisim.validation.validate import end_to_end, percentile_errors


def same_replica(measured: pd.DataFrame, predicted: pd.DataFrame) -> float:
    """The share of requests both request frames (rid, replica) put on the same replica, matched by rid."""
    m = measured.set_index("rid")["replica"]
    p = predicted.set_index("rid")["replica"]
    return float((m == p.reindex(m.index)).mean()) if len(m) else float("nan")


def on_measured_routing(scenario, source: str, measured: pd.DataFrame, progress: bool = False) -> dict:
    """End-to-end errors of the simulated fleet routed as ``measured`` (the real fleet's requests frame: rid,
    replica, latencies, finish_s) against it: ``{"same_replica", "fleet": {...}, "replicas": [{"replica", ...}]}``,
    each section with ``end_to_end`` and ``percentile_errors``; ``same_replica``: the share of requests the re-run
    put on the recorded replica (1 unless one was down). Requests the real router rejected (no replica) are
    routed by least load."""
    from granisim.fleet.build import simulate_fleet
    from granisim.fleet.outputs import fleet_requests, fleet_steps
    from granisim.fleet.routers import Router, replay, replayed

    served = measured[measured.replica >= 0]
    routed = simulate_fleet(scenario, source, None, progress,
                            router=Router("replay", replayed(zip(served.rid, served.replica)), replay))
    sreq, ssteps = fleet_requests(routed), fleet_steps(routed)
    m_end = float(measured.finish_s.max())  # the real fleet's end: its last request's finish
    no_steps = pd.DataFrame()

    def section(m, s, st) -> dict:
        return {"end_to_end": end_to_end(summarize(m, no_steps, m_end), summarize(s, st, routed.end_s)),
                "percentile_errors": percentile_errors(m, s)}

    out = {"same_replica": same_replica(measured, sreq), "fleet": section(measured, sreq, ssteps), "replicas": []}
    for i in sorted(int(r) for r in served.replica.unique()):
        out["replicas"].append({"replica": i, **section(measured[measured.replica == i], sreq[sreq.replica == i],
                                                        ssteps[ssteps.replica == i] if len(ssteps) else ssteps)})
    return out
