"""GraniKV GPU backend: Triton attention kernels and (later) the real engine.

Imports torch and triton; the simulator (`granisim`) never imports this package.
The kernel contract (layouts, shapes, launchers) is written down in docs/kernels.md.
"""
from .kernels.layout import PageTable, Slabs, SlotLists  # noqa: F401
from .kernels.cascade import cascade_prefix_attention  # noqa: F401
from .kernels.decode import decode_attention  # noqa: F401
from .kernels.dense import dense_prefix_attention  # noqa: F401
from .kernels.extend import extend_attention  # noqa: F401
from .kernels.kv_write import write_kv  # noqa: F401
from .kernels.merge import merge_states  # noqa: F401
