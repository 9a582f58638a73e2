"""The one wording for a user's file that cannot be read (missing, unreadable, or not UTF-8 text), an error's
message on one line, and the argument parser whose mistakes are one line too."""

from __future__ import annotations

import argparse
from pathlib import Path


def unreadable(err: OSError | UnicodeDecodeError, missing: str = "file not found") -> str:
    """Why the file could not be read, for a one-line error that also names the file and field."""
    if isinstance(err, FileNotFoundError):
        return missing
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text (offset {err.start})"
    return f"cannot read ({err.strerror})"


def one_line(err: BaseException, limit: int | None = 120) -> str:
    """``err``'s message on one line (its whitespace runs as single spaces), at most ``limit`` characters: the
    detail in parentheses after a one-line error that names the file."""
    text = " ".join(str(err).split())
    return text if limit is None else text[:limit]


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage block: every `granisim` command and
    `granisim validation` verb."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def out_folder(given: str | Path | None, default: str | Path | None = None, option: str = "--out") -> Path:
    """The folder a command writes into (``option``, else ``default``); a file there is refused (ValueError, one
    line) before anything runs, not when the outputs are written; so is a file where a folder above it goes."""
    if given is not None and not str(given).strip():  # Path('') is the current folder: never meant
        raise ValueError(f"{option} {str(given)!r}: empty; give a folder to write into")
    out = Path(given or default)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{option} {out}: a file is there; give a folder to write into")
    above = file_under_a_file(out)
    if above:
        raise ValueError(f"{option} {out}: {above} is a file, not a folder")
    return out


def out_file(given: str | Path, option: str = "--out", what: str = "the file to write") -> Path:
    """A file a command writes (``option``): a folder there, or a file where a folder above it goes, is refused
    (ValueError, one line) before the work whose result it would hold, not when the result is written."""
    out = Path(given)
    if out.is_dir():
        raise ValueError(f"{option} {out}: a folder; give {what}")
    above = file_under_a_file(out)
    if above:
        raise ValueError(f"{option} {out}: {above} is a file, not a folder")
    return out


def file_under_a_file(path: str | Path) -> Path | None:
    """The nearest existing folder-to-be above ``path`` where it is a file (so ``path`` cannot be written), else
    None."""
    above = next((p for p in Path(path).parents if p.exists()), None)
    return above if above is not None and not above.is_dir() else None


def read_json(path: str | Path):
    """A JSON file's value; unreadable, not UTF-8 or not JSON -> ValueError naming the file (one line)."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({one_line(err, 160)})") from None
