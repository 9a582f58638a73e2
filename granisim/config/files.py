"""The one wording for a user's file that cannot be read: missing, unreadable, or not UTF-8 text."""

from __future__ import annotations


def unreadable(err: OSError | UnicodeDecodeError, missing: str = "file not found") -> str:
    """Why the file could not be read, for a one-line error that also names the file and field."""
    if isinstance(err, FileNotFoundError):
        return missing
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text (offset {err.start})"
    return f"cannot read ({err.strerror})"
