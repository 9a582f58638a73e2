"""An engine profile carried onto another GPU's microbenchmark profile.

An engine-calibrated profile (``h200-engine``) is a microbenchmark profile (its ``base``, ``h200``) plus what the
real engine adds on that GPU: per-part corrections of the step's price, host terms, and what a decoding request
pays to re-read a prefix other requests of its group read in the same launch (``attn.decode.shared_reread``).
:func:`carry` writes the same corrections on another base (``h100-sxm``, measured on that GPU by the
microbenchmarks alone), for a GPU where the engine has not been run yet:

* every correction and host term carried unchanged (the same engine code pays the same in-situ costs relative
  to the kernels' own times, and the same host work);
* the re-read share rescaled: a re-read is served from L2, whose rate follows the SMs, while the profile prices it
  as a share of the decode kernel's HBM stream (``hbm_bandwidth x attn.decode.mem_eff``). Keeping its time per
  byte gives ``share x (stream' / stream) x (SMs / SMs')``: on an H100 (0.70x the H200's stream, the same 132
  SMs at the same clock) the H200's 0.85 becomes 0.60.

Every carried coefficient's source says it is extrapolated, from which profile and how. Pure: the caller reads
and writes the files.
"""

from __future__ import annotations

from granisim.config.coefficients import HardwareProfile

REREAD = "attn.decode.shared_reread"


def _stream(p: HardwareProfile) -> float:
    """The decode kernel's KV stream rate the profile prices, bytes/s."""
    return p["hbm_bandwidth"] * p["attn.decode.mem_eff"]


def reread_ratio(old: HardwareProfile, new: HardwareProfile) -> float:
    """What a re-read share becomes on ``new`` over its value on ``old``: keeps its seconds per byte (an L2 rate
    that follows the SM count) while the share prices it against each GPU's decode stream."""
    return (_stream(new) / _stream(old)) * (old["sm_count"] / new["sm_count"])


def carry(coefficients: dict, engine: str, old: HardwareProfile, new: HardwareProfile) -> dict:
    """The engine profile's own ``coefficients`` (JSON form, as its file holds them) for base ``new``; ``old`` is
    the base they were fitted on."""
    r = reread_ratio(old, new)
    out = {}
    for name, c in coefficients.items():
        was = c["source"]
        fitted = f"{engine} (on {old.name}: {was.get('kind')}{', ' + was['date'] if was.get('date') else ''})"
        value = c["value"]
        if name == REREAD:
            value = min(1.0, value * r)
            how = (f"x{r:.4f}: the re-read's time per byte kept (served from L2, whose rate follows the SMs: "
                   f"{old['sm_count']:g} -> {new['sm_count']:g}) against the decode stream it is a share of "
                   f"(hbm_bandwidth x attn.decode.mem_eff: {_stream(old) / 1e12:.3f} -> {_stream(new) / 1e12:.3f} "
                   "TB/s); at most 1 (a re-read costs no more than a first read)")
        elif name.startswith(("overhead.", "host.")):
            how = (f"carried unchanged from {old.name} to {new.name}: the same engine's host work and copy stream "
                   "(the host's speed not scaled)")
        else:
            how = f"carried unchanged from {old.name} to {new.name}: the same engine's correction to its kernels' prices"
        out[name] = {"value": value, "unit": c["unit"], "source": {"kind": "extrapolated", "from": fitted, "how": how}}
    return out
