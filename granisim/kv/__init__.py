"""GraniKV's memory core: KV pools, radix prefix index and allocator policies (integers only).

:class:`KVAllocator` owns its parts (pools, radix index, request table, counters, eviction,
HOT slabs, views); :mod:`granisim.kv.allocator` says who owns what.
"""

from granisim.kv.allocator import POLICIES, KVAllocator, OutOfKVMemory, make_allocator
from granisim.kv.cold_pool import ColdPool
from granisim.kv.hot_pool import HotPool, KVCopy
from granisim.kv.layout import AllocatorStats, KVSegment, PoolStats, RequestLayout
from granisim.kv.paged_pool import PagedPool
from granisim.kv.radix import MatchResult, RadixIndex, RadixNode

__all__ = [
    "POLICIES", "KVAllocator", "OutOfKVMemory", "make_allocator", "ColdPool", "HotPool", "KVCopy",
    "AllocatorStats", "KVSegment", "PoolStats", "RequestLayout", "PagedPool", "MatchResult",
    "RadixIndex", "RadixNode",
]
