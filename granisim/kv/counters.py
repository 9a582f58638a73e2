"""The allocator's event counters (lookups, hits, evictions, HOT placements).

One mutable record owned by :class:`granisim.kv.allocator.KVAllocator`; the parts that
count an event are handed the same record (:class:`granisim.kv.eviction.Eviction` counts
evictions, :class:`granisim.kv.hot_slabs.HotSlabs` counts HOT placements and fallbacks).
:meth:`granisim.kv.views.AllocatorViews.stats` copies it into the frozen
:class:`granisim.kv.layout.AllocatorStats`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class AllocatorCounters:
    lookups: int = 0  # admissions (each matches the prompt against the radix index once)
    hit_tokens: int = 0  # prompt tokens found cached at admission
    lookup_tokens: int = 0  # prompt tokens looked up at admission
    evictions: int = 0  # radix nodes freed
    evicted_tokens: int = 0  # tokens those nodes held
    hot_placements: int = 0  # shared prefixes given a HOT slab
    hot_fallbacks: int = 0  # shared prefixes that wanted a slab and went to COLD
    hot_evictions: int = 0  # HOT leaf subtrees evicted to make room or to shrink HOT

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in _FIELDS}  # asdict() deep-copies: slow on every stats()


_FIELDS = fields(AllocatorCounters)
