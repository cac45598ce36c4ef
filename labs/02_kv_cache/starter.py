"""Lab 02: the KV-cache block allocator of PagedAttention. Write the methods marked TODO.

The paged KV cache is one pool of ``num_blocks`` blocks of ``block_size`` token slots each. This
class only keeps the books: which physical blocks each sequence's *block table* lists, and how
many tables hold each block (its reference count). Token position ``p`` of a sequence lives in
slot ``block_table[p // block_size] * block_size + p % block_size``.

    allocate(seq, prompt)   a table covering the prompt (ceil(len / block_size) blocks)
    append_slot(seq)        one more token slot: a new block only when the last one is full;
                            copy-on-write when the last block is shared
    fork(parent, child)     the child shares every block of the parent
    free(seq)               the sequence is done: its blocks go back to the pool

The token ids live on the sequence, not here: the allocator counts slots. It reads ids only to
look a prompt up and, in the stretch, to name blocks.

Stretch (prefix caching, `enable_prefix_caching=True`): `cache_blocks(seq, token_ids)` is called
once the K/V of the sequence's first len(token_ids) tokens is written; it keys every FULL block
among them by a chained hash of (parent block's hash, its token ids). `allocate` reuses the leading
blocks found by hash, and a freed block keeps its content (and stays findable) until the pool runs
short, then the least recently freed one is reused first.

Grade your work with `inferlab grade labs/02_kv_cache`. Keep the names and signatures; add any
helper or field you like.
"""
from __future__ import annotations

from collections import OrderedDict, deque


class NoFreeBlocksError(RuntimeError):
    """The pool has no free block left (a scheduler catches this to preempt a sequence)."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks           # how many tables hold each block
        self.free_list = deque(range(num_blocks))    # blocks nobody holds
        self.tables: dict[int, list[int]] = {}       # seq id -> its block table
        self.lengths: dict[int, int] = {}            # seq id -> how many token slots its table covers
        # for the stretch goal: what each named block holds, and the prefix cache
        self.block_tokens: list[tuple[int, ...]] = [()] * num_blocks
        self.block_hashes: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()   # free but cached, oldest first

    # ---- given ----------------------------------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        return list(self.tables[seq_id])

    def num_tokens(self, seq_id: int) -> int:
        return self.lengths[seq_id]

    def ref_count(self, block_id: int) -> int:
        return self.ref_counts[block_id]

    # ---- yours ----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with reference count 0 (with prefix caching: cached-but-free ones too)."""
        raise NotImplementedError("about 1 line")

    def can_allocate(self, num_tokens: int) -> bool:
        """Are there enough free blocks for a new sequence of num_tokens (ignoring prefix hits)?"""
        raise NotImplementedError("about 1 line")

    def slot(self, seq_id: int, position: int) -> int:
        """The physical slot of a token position of a sequence (vLLM's slot_mapping)."""
        raise NotImplementedError("about 2 lines")

    def allocate(self, seq_id: int, token_ids: list[int]) -> int:
        """Give a new sequence a block table covering all of token_ids.

        Return how many leading tokens already have K/V in the cache: 0 without prefix caching;
        with it, block_size x the number of leading full blocks found by hash, at most
        len(token_ids) - 1 (one token must still be computed). If the pool is short, raise
        NoFreeBlocksError having allocated NOTHING.
        """
        raise NotImplementedError("about 12 lines; about 30 with prefix caching")

    def append_slot(self, seq_id: int) -> list[tuple[int, int]]:
        """The sequence grows by one token slot. Take a new block when the last one is full; if the
        last block is shared (ref count > 1), copy-on-write: take a fresh block for this sequence
        and return [(shared_block, fresh_block)] so the cache copies the K/V rows. Otherwise
        return []. Raise NoFreeBlocksError, changing nothing, when a block is needed and none is free.
        """
        raise NotImplementedError("about 15 lines")

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (each ref count + 1)."""
        raise NotImplementedError("about 5 lines")

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks (ref count - 1; at 0 back to the pool). KeyError if unknown."""
        raise NotImplementedError("about 8 lines")

    # ---- stretch: prefix caching ----------------------------------------------------------
    def cache_blocks(self, seq_id: int, token_ids: list[int]) -> None:
        """The K/V of the sequence's first len(token_ids) tokens (these ids) is written: give each
        full block among them not named yet its chained hash, so later prompts find it."""
        if not self.enable_prefix_caching:
            return
        raise NotImplementedError("stretch: about 10 lines")
