"""The shape every user mistake must take at the command line: exit 2 and one stderr line."""

import re

# `error: ...`, or argparse's `granisim validation VERB: error: ...` for a malformed argument
ERROR_LINE = re.compile(r"^(granisim[\w -]*: )?error: ")


def one_line_error(capsys, rc: int, *needles: str) -> str:
    """The command failed with exit 2 and exactly one stderr line (ERROR_LINE) holding every needle."""
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert ERROR_LINE.match(lines[0]) and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
