"""KV caches: the contiguous one (one slab per sequence) and the paged one (blocks + block tables)."""
from inferlab.cache.contiguous import ContiguousKVCache
from inferlab.cache.paged import PagedKVCache

__all__ = ["ContiguousKVCache", "PagedKVCache"]
