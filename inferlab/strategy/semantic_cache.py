"""A semantic cache: serve a stored answer when a new request *means* the same as an old one.

    lookup(query):  embed the query -> cosine similarity with every cached query (brute force:
                    one matrix-vector product) -> the nearest one's answer if its similarity
                    >= threshold, else a miss (the engine generates, then ``insert`` stores it)

GPTCache (Bang 2023) popularised this for LLM APIs. The threshold trades hits against wrong
answers: "reset my router" sits close to "reset my password" because most of its words are the
same. Two mitigations are built in: ``scope`` (only entries of the same topic compete, e.g. the
support menu the customer picked) and ``verify`` (a second check on the candidate before it is
served). Entries leave by TTL (answers go stale) and, when full, least recently used first.

Brute force reads ``n x dim`` floats per lookup: ~1 MB at 1k entries of 256 dims (tens of
microseconds), ~100 MB at 100k (milliseconds, more than the embedding itself). An approximate
index (HNSW: Malkov & Yashunin 2018, in faiss or hnswlib) pays off from about 100k entries;
notebook 07 measures where.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from inferlab.strategy import thresholds


@dataclasses.dataclass
class CacheHit:
    answer: str
    similarity: float
    query: str       # the cached request that matched
    slot: int


class SemanticCache:
    """embedder: an object with ``embed(list[str]) -> unit vectors [n, dim]`` (``inferlab.strategy.embed``).
    threshold: the least cosine similarity served. capacity: entries kept. ttl_s: seconds an entry
    lives (None: forever). clock: the time source (tests pass a fake one). verify: optional second
    check ``verify(query, cached_query) -> bool`` on the nearest entry. nearest: the neighbour search,
    ``nearest(keys [n, dim], query [dim]) -> (row, cosine)`` (lab 07's contract; default the reference
    ``inferlab.strategy.thresholds.nearest``)."""

    def __init__(self, embedder, threshold: float = 0.85, capacity: int = 1024, ttl_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, verify: Callable[[str, str], bool] | None = None,
                 nearest: Callable = thresholds.nearest):
        if not -1 <= threshold <= 1:
            raise ValueError(f"threshold is a cosine similarity in [-1, 1], got {threshold}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 seconds or None (no expiry), got {ttl_s}")
        self.embedder, self.threshold, self.capacity, self.ttl_s = embedder, threshold, capacity, ttl_s
        self.clock, self.verify, self.search = clock, verify, nearest
        self.keys = np.zeros((capacity, embedder.dim), dtype=np.float32)
        self.valid = np.zeros(capacity, dtype=bool)
        self.created = np.zeros(capacity)
        self.last_used = np.zeros(capacity)
        self.queries: list[str | None] = [None] * capacity
        self.answers: list[str | None] = [None] * capacity
        self.scopes: list[object] = [None] * capacity
        self.stats = {"hits": 0, "misses": 0, "rejected_by_verify": 0, "evicted_lru": 0, "expired": 0}

    def __len__(self) -> int:
        self._expire()
        return int(self.valid.sum())

    def _expire(self) -> None:
        if self.ttl_s is None:
            return
        old = self.valid & (self.clock() - self.created >= self.ttl_s)
        self.stats["expired"] += int(old.sum())
        self.valid &= ~old

    def nearest(self, embedding: np.ndarray, scope=None) -> tuple[int, float]:
        """The slot of the most similar live entry (in ``scope`` if given) and its cosine; (-1, -inf)
        when none. Brute force over the live rows (``self.search``, one matrix-vector product)."""
        self._expire()
        mask = self.valid if scope is None else self.valid & np.array([s == scope for s in self.scopes])
        live = np.flatnonzero(mask)
        i, sim = self.search(self.keys[live], embedding)
        return (int(live[i]), float(sim)) if i >= 0 else (-1, float("-inf"))

    def lookup(self, query: str, scope=None, embedding: np.ndarray | None = None) -> CacheHit | None:
        """The cached answer for ``query``, or None (a miss). Pass ``embedding`` if already computed."""
        e = self.embedder.embed([query])[0] if embedding is None else embedding
        slot, sim = self.nearest(e, scope)
        if slot < 0 or not thresholds.serves(sim, self.threshold):
            self.stats["misses"] += 1
            return None
        if self.verify is not None and not self.verify(query, self.queries[slot]):
            self.stats["rejected_by_verify"] += 1
            self.stats["misses"] += 1
            return None
        self.last_used[slot] = self.clock()
        self.stats["hits"] += 1
        return CacheHit(self.answers[slot], sim, self.queries[slot], slot)

    def insert(self, query: str, answer: str, scope=None, embedding: np.ndarray | None = None) -> int:
        """Store ``answer`` for ``query``; a full cache first drops expired entries, then the least
        recently used one. Returns the slot."""
        e = self.embedder.embed([query])[0] if embedding is None else embedding
        self._expire()
        free = np.flatnonzero(~self.valid)
        if len(free):
            slot = int(free[0])
        else:
            slot = int(np.argmin(self.last_used))
            self.stats["evicted_lru"] += 1
        now = self.clock()
        self.keys[slot], self.valid[slot], self.created[slot], self.last_used[slot] = e, True, now, now
        self.queries[slot], self.answers[slot], self.scopes[slot] = query, answer, scope
        return slot
