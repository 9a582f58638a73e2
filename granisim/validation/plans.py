"""The stored plans of a validation run (``plans.pkl``, written by :func:`granisim.validation.validate.validate`).

Plans pickled before the package layout changed name their classes by the old module paths;
:func:`load_plans` reads both.
"""

from __future__ import annotations

import pickle
from pathlib import Path

# module path in older plans.pkl files -> where the class lives now
RENAMED = {"granisim.plan": "granisim.core.contract"}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return super().find_class(RENAMED.get(module, module), name)


def load_plans(path: Path) -> list:
    with open(path, "rb") as f:
        return _Unpickler(f).load()
