"""Suite-wide setup: the Triton interpreter on CPU machines, and the `gpu` marker."""
import os

import pytest

# Must be set before triton is first imported anywhere in the session.
try:
    import torch as _torch

    _HAS_CUDA = _torch.cuda.is_available()
except ImportError:  # the simulator's tests run without torch
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
