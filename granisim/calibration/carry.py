"""An engine profile carried onto another GPU's microbenchmark profile.

An engine-calibrated profile (``h200-engine``) is a microbenchmark profile (its ``base``, ``h200``) plus what the
real engine adds on that GPU: per-part corrections of the step's price, host terms, and what a decoding request
pays to re-read a prefix other requests of its group read in the same launch (``attn.decode.shared_reread``, a
share of a first read). :func:`carry` writes the same corrections on another base (``h100-sxm``, measured on that
GPU by the microbenchmarks alone), for a GPU where the engine has not been run yet:

* every correction and host term carried unchanged (the same engine code pays the same in-situ costs relative
  to the kernels' own times, and the same host work);
* the re-read share split in two: the decode kernel's own share, measured alone on each GPU
  (``attn.decode.kernel_reread``, granisim/calibration/reread.py: re-reads served from L2), and what the engine
  adds on top in situ (the share's excess over the kernel's on the fitted GPU; re-reads that miss L2 among the
  step's other traffic, priced at the decode stream as the share is). The excess is carried, the kernel's share is
  the new GPU's: ``share' = kernel' + (share - kernel)``. Where the new profile has no measured kernel share, it is
  estimated by keeping the old one's time per byte (L2, whose rate follows the SMs, against each GPU's decode
  stream ``hbm_bandwidth x attn.decode.mem_eff``); where the old one has none, the whole share is taken as the
  kernel's.

Every carried coefficient's source says it is extrapolated, from which profile and how. Pure: the caller reads
and writes the files.
"""

from __future__ import annotations

from granisim.config.coefficients import HardwareProfile

REREAD = "attn.decode.shared_reread"
KERNEL = "attn.decode.kernel_reread"


def _stream(p: HardwareProfile) -> float:
    """The decode kernel's KV stream rate the profile prices, bytes/s."""
    return p["hbm_bandwidth"] * p["attn.decode.mem_eff"]


def l2_ratio(old: HardwareProfile, new: HardwareProfile) -> float:
    """What a share served from L2 becomes on ``new`` over its value on ``old``: its seconds per byte kept (an L2
    rate that follows the SM count) while the share prices it against each GPU's decode stream."""
    return (_stream(new) / _stream(old)) * (old["sm_count"] / new["sm_count"])


def carried_reread(share: float, old: HardwareProfile, new: HardwareProfile) -> tuple[float, str]:
    """The engine's re-read share on ``new`` and how it was made."""
    measured_old, measured_new = KERNEL in old.coefficients, KERNEL in new.coefficients
    k_old = old[KERNEL] if measured_old else share
    if measured_new:
        k_new, kernel = new[KERNEL], f"measured on {new.name} ({new[KERNEL]:g})"
    else:
        r = l2_ratio(old, new)
        k_new = k_old * r
        kernel = (f"{k_old:g} x{r:.4f} = {k_new:.3g}, its time per byte kept (served from L2, whose rate follows the "
                  f"SMs: {old['sm_count']:g} -> {new['sm_count']:g}) against the decode stream (hbm_bandwidth x "
                  f"attn.decode.mem_eff: {_stream(old) / 1e12:.3f} -> {_stream(new) / 1e12:.3f} TB/s)")
    value = k_new + (share - k_old)
    if not 0 < value:
        raise ValueError(f"{new.name}: field {REREAD}: value {value:.3g}: the kernel's share on {new.name} "
                         f"({k_new:.3g}) less the engine's deficit on {old.name} ({k_old - share:.3g}) is not positive")
    value = min(1.0, value)
    how = (f"the engine's excess over the decode kernel's own share on {old.name} ({share:g} - "
           f"{k_old:g}{' measured' if measured_old else ', none measured'}) carried, plus the kernel's share on "
           f"{new.name}: {kernel}; at most 1 (a re-read costs no more than a first read)")
    return value, how


def carry(coefficients: dict, engine: str, old: HardwareProfile, new: HardwareProfile) -> dict:
    """The engine profile's own ``coefficients`` (JSON form, as its file holds them) for base ``new``; ``old`` is
    the base they were fitted on."""
    out = {}
    for name, c in coefficients.items():
        was = c["source"]
        fitted = f"{engine} (on {old.name}: {was.get('kind')}{', ' + was['date'] if was.get('date') else ''})"
        value = c["value"]
        if name == REREAD:
            value, how = carried_reread(value, old, new)
        elif name.startswith(("overhead.", "host.")):
            how = (f"carried unchanged from {old.name} to {new.name}: the same engine's host work and copy stream "
                   "(the host's speed not scaled)")
        else:
            how = f"carried unchanged from {old.name} to {new.name}: the same engine's correction to its kernels' prices"
        out[name] = {"value": value, "unit": c["unit"], "source": {"kind": "extrapolated", "from": fitted, "how": how}}
    return out
