"""KV caches: the contiguous one here; the paged cache (block allocator, block tables) beside it."""
from inferlab.cache.contiguous import ContiguousKVCache

__all__ = ["ContiguousKVCache"]
