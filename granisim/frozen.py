"""Fast construction of frozen slots dataclasses, for objects the simulator makes per request or per plan."""
from __future__ import annotations

from dataclasses import fields


def slot_setters(cls) -> tuple:
    """The slot setters of a frozen slots dataclass's fields, in field order (they bypass the frozen
    ``__setattr__``): a fast constructor makes ``object.__new__(cls)`` and sets every field through them."""
    return tuple(cls.__dict__[f.name].__set__ for f in fields(cls))
