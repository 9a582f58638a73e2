"""A profile made from another: ``"base"`` names it, and the file holds only what it changes.

    {"schema": "granikv-hardware-profile/1", "name": "h200-engine-steps", "notes": "...",
     "base": {"profile": "h200-engine", "sha256": "3f0c..."},
     "step_classes": {...}}

The base is a shipped profile's name or a path (relative to this file). The profile is the base's fields with
this file's on top; ``coefficients`` merge by name (this file's win). ``sha256`` is the digest of the base file
(first 16 hex digits) when this profile was made from it: a profile fitted on another's prices (step-class
factors are ratios to the base's price) refuses to load once its base has changed, rather than apply its
figures to prices they were not fitted on. Bases may have bases (no cycle can form: each file holds the digest
of the one before it).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

TABLE_FIELDS = ("linear_table", "kernel_table")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _is_path(ref: str) -> bool:
    return ref.endswith(".json") or "/" in ref


def base_file(ref: str, beside: Path, profile_dir: Path) -> Path:
    """The file a ``base.profile`` reference names: a path (relative to ``beside``) or a shipped name."""
    return (beside / ref).resolve() if _is_path(ref) else (profile_dir / f"{ref}.json").resolve()


def _absolute_tables(raw: dict, folder: Path) -> None:
    """Table files found beside the base, named by absolute path (the profile made from it may live elsewhere)."""
    tables = [raw.get(f) for f in TABLE_FIELDS] + list(raw.get("more_linear_tables") or [])
    for t in tables:
        if isinstance(t, dict) and isinstance(t.get("file"), str) and (folder / t["file"]).is_file():
            t["file"] = str((folder / t["file"]).resolve())


def reference(raw) -> str | None:
    """The base a profile's JSON names (``base.profile``), or None."""
    base = raw.get("base") if isinstance(raw, dict) else None
    return base.get("profile") if isinstance(base, dict) else None


def resolve(path: Path, raw: dict, profile_dir: Path, fail) -> dict:
    """``raw`` (the JSON of the profile at ``path``) with its base's fields filled in; without ``base``, as it is.
    ``fail(file, field, value, why)`` makes the one-line error."""
    if not isinstance(raw, dict) or "base" not in raw:
        return raw
    raw = dict(raw)
    base = raw.pop("base")
    if (not isinstance(base, dict) or set(base) != {"profile", "sha256"}
            or not all(isinstance(v, str) and v for v in base.values())):
        raise fail(path, "base", base, 'must be {"profile": a profile name or path, "sha256": its digest}')
    bpath = base_file(base["profile"], path.parent, profile_dir)
    if not bpath.is_file():
        known = ", ".join(sorted(p.stem for p in profile_dir.glob("*.json")))
        raise fail(path, "base.profile", base["profile"], f"no such profile (known: {known}; or a path to a .json)")
    now = digest(bpath)
    if now != base["sha256"]:
        raise fail(path, "base.sha256", base["sha256"],
                   f"{bpath.name} has changed since this profile was made from it (digest now {now}): "
                   f"make this profile again from it")
    try:
        braw = json.loads(bpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise fail(path, "base.profile", base["profile"], f"unreadable base ({type(e).__name__})") from None
    braw = resolve(bpath, braw, profile_dir, fail)
    if not isinstance(braw, dict):
        raise fail(path, "base.profile", base["profile"], "the base is not a JSON object")
    _absolute_tables(braw, bpath.parent)
    merged = {**braw, **raw}
    coefs, inherited = raw.get("coefficients", {}), braw.get("coefficients")
    if isinstance(coefs, dict) and isinstance(inherited, dict):  # else the schema names the field that is no object
        merged["coefficients"] = {**inherited, **coefs}
    return merged


def derived(base: str, out: Path, profile_dir: Path, name: str, notes: str) -> dict:
    """The start of a profile written to ``out`` and made from ``base`` (a shipped name or a path): its ``base``
    reference (a path relative to ``out``'s folder) and digest; the caller adds what it changes."""
    bpath = base_file(base, Path.cwd(), profile_dir)
    ref = os.path.relpath(bpath, out.resolve().parent) if _is_path(base) else base
    gpu = json.loads(bpath.read_text()).get("gpu")
    return {"schema": "granikv-hardware-profile/1", "name": name, **({"gpu": gpu} if gpu else {}), "notes": notes,
            "base": {"profile": ref, "sha256": digest(bpath)}}
