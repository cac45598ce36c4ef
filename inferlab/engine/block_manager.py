"""The KV-cache block allocator of PagedAttention (Kwon et al., SOSP'23), with prefix caching.

A contiguous KV cache reserves ``max_model_len`` slots per sequence up front, mostly left empty.
PagedAttention cuts the cache into **blocks** of ``block_size`` slots, like pages of virtual memory:
a sequence owns a *block table* (its physical block ids) and gets a new block only when its last
one is full, so at most one partly filled block per sequence is wasted.

This module only keeps the books (which block belongs to whom); the K/V tensors live in the paged
cache (``inferlab/cache/paged.py``, per layer ``[num_blocks, block_size, num_kv_heads, head_dim]``).
Token position ``p`` of a sequence lives in physical slot
``block_table[p // block_size] * block_size + p % block_size`` (vLLM's ``slot_mapping``).

Three ideas beyond the free list:

* **Reference counts** let several tables hold the same block: a forked sequence (parallel
  sampling) or a shared prompt prefix costs no extra memory.
* **Copy-on-write**: before a sequence writes into a shared, partly filled block it gets its own
  copy; ``append_slot`` returns ``(src, dst)`` pairs and the cache copies those K/V rows.
* **Prefix caching** (vLLM's automatic prefix caching): each *full* block is named by a chained
  hash of (parent block's hash, its token ids), so equal hashes mean equal prefixes up to that
  block. A new sequence reuses every leading block found in the table of hashes. A freed block
  keeps its content and stays findable until the pool runs short; then the least recently used
  one is evicted (its hash forgotten) and reused.

The token ids themselves live on the sequence (``EngineSequence``); the allocator counts slots and
reads ids only when it needs them: to look a prompt up, and to name blocks.

**A block is named only once its K/V is written.** ``allocate`` and ``append_slot`` reserve slots
for tokens the next step will compute; nothing is findable yet. After the step, the scheduler calls
``cache_blocks(seq, computed token ids)``, which names the full blocks lying wholly below
``num_computed_tokens`` (vLLM v1's rule). Naming at reservation time would be wrong whenever the
reservation outlives its step unrun: a sequence preempted while it grows (its filled blocks would
park in the cache with slots nobody wrote), or a forward that raised (the server then aborts the
requests in flight, and their blocks are freed). The next prompt with that prefix would skip
computing those positions and read garbage. We chose this over an
all-or-nothing ``grow``, which closes only the preemption path: naming after the step follows
the one fact that matters (the K/V exists) and so covers every path, at the price that two
prompts with a new shared prefix admitted in the *same* step do not share it; from the next step
on, they and every later one do.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field


class NoFreeBlocksError(RuntimeError):
    """The pool has no free block left: the scheduler catches this to preempt a sequence."""


@dataclass
class Block:
    """One physical block: who holds it and, once it is named, what it holds.

    The token ids of a sequence live on the sequence; the allocator keeps only how many slots each
    table covers. A *named* block also keeps the ids its hash was computed from, so a prefix hit
    can check that the content matches and not only the hash."""

    block_id: int
    ref_count: int = 0
    hash: int | None = None          # set once the block is full, computed and registered (prefix caching)
    token_ids: tuple[int, ...] = ()  # the content the hash names (empty while unnamed)

    def reset(self) -> None:
        self.ref_count, self.hash, self.token_ids = 0, None, ()


def block_hash(parent_hash: int | None, token_ids: list[int] | tuple[int, ...]) -> int:
    """Chained hash of a full block: equal hashes mean equal token ids *and* equal prefix."""
    return hash((parent_hash, tuple(token_ids)))


class BlockManager:
    """Hands out block ids to sequences and keeps reference counts, tables and the prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))        # free and holding nothing findable
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free but cached, LRU first
        self._hash_to_block: dict[int, int] = {}
        self._tables: dict[int, list[int]] = {}
        self._num_tokens: dict[int, int] = {}                    # how many token slots the table covers
        self._hashes: dict[int, list[int]] = {}                  # chained hashes of its named leading blocks
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- the pool -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_count 0, cached-but-free ones included (they can be evicted)."""
        return len(self._free) + len(self._evictable)

    def can_allocate(self, num_tokens: int) -> bool:
        """Enough free blocks for a new sequence of num_tokens, ignoring possible prefix hits."""
        return self._blocks_for(num_tokens) <= self.num_free_blocks

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)   # ceil

    def _take_free_block(self) -> Block:
        """A block nobody holds: an empty one if any, else evict the least recently used cached one."""
        if self._free:
            block = self.blocks[self._free.popleft()]
        elif self._evictable:
            block_id, _ = self._evictable.popitem(last=False)
            block = self.blocks[block_id]
            if self._hash_to_block.get(block.hash) == block_id:
                del self._hash_to_block[block.hash]
            block.reset()
        else:
            raise NoFreeBlocksError(f"all {self.num_blocks} KV blocks are in use; free or preempt a sequence")
        block.ref_count = 1
        return block

    def _hold(self, block: Block) -> None:
        """One more table holds this block; a cached-but-free block is revived."""
        if block.ref_count == 0:
            del self._evictable[block.block_id]
        block.ref_count += 1

    def _release(self, block: Block) -> None:
        block.ref_count -= 1
        if block.ref_count == 0:
            if self.enable_prefix_caching and block.hash is not None:
                self._evictable[block.block_id] = None   # most recently used end
            else:
                block.reset()
                self._free.append(block.block_id)

    def _register(self, block: Block, h: int, token_ids: list[int]) -> None:
        """Make a full block findable by its chained hash (first block with this content wins)."""
        if self.enable_prefix_caching and h not in self._hash_to_block:
            self._hash_to_block[h] = block.block_id
            block.hash, block.token_ids = h, tuple(token_ids)

    # ---- sequences ------------------------------------------------------------------------
    def allocate(self, seq_id: int, token_ids: list[int], lookup: bool = True) -> int:
        """Give a new sequence a block table covering all of token_ids; return num_cached_tokens.

        With prefix caching, leading full blocks whose chained hash is known are reused (at most
        len(token_ids) - 1 tokens, so at least one token is computed and yields logits); with
        ``lookup=False`` none are (a request that needs every prompt row's logits). The ids are
        read for the lookup, not kept: the new blocks are named by ``cache_blocks`` once their
        K/V is written. Raises NoFreeBlocksError, having allocated nothing, when blocks run short.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id} already has a block table; free it before allocating again")
        if not token_ids:
            raise ValueError(f"sequence {seq_id}: cannot allocate an empty prompt; give at least one token id")
        bs = self.block_size
        num_blocks = self._blocks_for(len(token_ids))
        hashes, hits, parent = [], [], None
        if self.enable_prefix_caching and lookup:
            for i in range((len(token_ids) - 1) // bs):   # leave >= 1 token to compute
                h = block_hash(parent, token_ids[i * bs:(i + 1) * bs])
                block_id = self._hash_to_block.get(h)
                if block_id is None or self.blocks[block_id].token_ids != tuple(token_ids[i * bs:(i + 1) * bs]):
                    break
                hits.append(self.blocks[block_id])
                hashes.append(h)
                parent = h
        revived = sum(1 for b in hits if b.ref_count == 0)
        if num_blocks - len(hits) + revived > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {num_blocks - len(hits)} new KV blocks, {self.num_free_blocks} "
                f"are free; preempt or finish a sequence first")
        if self.enable_prefix_caching:
            self.prefix_queries += (len(token_ids) - 1) // bs
            self.prefix_hits += len(hits)
        for block in hits:                # revive hits before taking new blocks: no self-eviction
            self._hold(block)
        table = [b.block_id for b in hits]
        for _ in range(len(hits), num_blocks):
            table.append(self._take_free_block().block_id)
        self._tables[seq_id], self._num_tokens[seq_id], self._hashes[seq_id] = table, len(token_ids), hashes
        return len(hits) * bs

    def append_slot(self, seq_id: int) -> list[tuple[int, int]]:
        """The sequence grows by one token slot; return the (src, dst) block copies to make
        (copy-on-write). Which token goes there is the sequence's business, not the allocator's.

        A new block is taken when the last one is full; a shared last block is copied first so no
        other table sees this write. Raises NoFreeBlocksError, changing nothing, when none is free.
        """
        table, pos, copies = self._tables[seq_id], self._num_tokens[seq_id], []
        if pos % self.block_size == 0:                 # last block full (or none): a fresh block
            table.append(self._take_free_block().block_id)
        else:
            block = self.blocks[table[-1]]
            if block.ref_count > 1:                    # shared and partly filled: copy-on-write
                copy = self._take_free_block()
                block.ref_count -= 1
                table[-1] = copy.block_id
                copies.append((block.block_id, copy.block_id))
        self._num_tokens[seq_id] = pos + 1
        return copies

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Forget the sequence's slots from position ``num_tokens`` on (speculative decoding's
        rollback of rejected guesses); blocks left empty go back to the pool. Only slots past
        every named block can be dropped: a guess is never named (``cache_blocks`` runs after)."""
        table, bs = self._tables[seq_id], self.block_size
        if num_tokens >= self._num_tokens[seq_id]:
            return
        if num_tokens < self.num_cached_tokens(seq_id):
            raise ValueError(f"sequence {seq_id}: cannot truncate to {num_tokens} tokens inside its named blocks")
        self._num_tokens[seq_id] = num_tokens
        while len(table) > self._blocks_for(num_tokens):
            self._release(self.blocks[table.pop()])

    def cache_blocks(self, seq_id: int, token_ids: list[int]) -> None:
        """The K/V of the sequence's first ``len(token_ids)`` tokens, ``token_ids``, is written:
        name every full block below that line, so later prompts with this prefix find it (prefix
        caching). Blocks named before are skipped; ``num_cached_tokens`` says where they end."""
        if not self.enable_prefix_caching:
            return
        table, hashes, bs = self._tables[seq_id], self._hashes[seq_id], self.block_size
        for i in range(len(hashes), min(len(token_ids), self._num_tokens[seq_id]) // bs):
            ids = token_ids[i * bs:(i + 1) * bs]
            h = block_hash(hashes[-1] if hashes else None, ids)
            hashes.append(h)
            self._register(self.blocks[table[i]], h, ids)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (ref_count += 1 each): parallel sampling, n > 1."""
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id} already exists; fork into a new sequence id")
        table = self._tables[parent_id]
        for block_id in table:
            self._hold(self.blocks[block_id])
        self._tables[child_id] = list(table)
        self._num_tokens[child_id] = self._num_tokens[parent_id]
        self._hashes[child_id] = list(self._hashes[parent_id])

    def free(self, seq_id: int) -> None:
        """The sequence is finished, aborted or preempted: release its blocks (KeyError if unknown).

        Blocks are released tail first, so among one sequence's cached blocks the tail (the least
        likely to be shared) is evicted first.
        """
        table = self._tables.pop(seq_id)
        del self._num_tokens[seq_id], self._hashes[seq_id]
        for block_id in reversed(table):
            self._release(self.blocks[block_id])

    # ---- lookups --------------------------------------------------------------------------
    def block_table(self, seq_id: int) -> list[int]:
        return list(self._tables[seq_id])

    def num_tokens(self, seq_id: int) -> int:
        """Token slots the sequence's table covers (its computed tokens plus those reserved for
        the next step)."""
        return self._num_tokens[seq_id]

    def num_cached_tokens(self, seq_id: int) -> int:
        """Leading tokens of the sequence in named blocks: ``cache_blocks`` names from here on."""
        return len(self._hashes[seq_id]) * self.block_size

    def slot(self, seq_id: int, position: int) -> int:
        """Physical slot of a token position: block_table[p // block_size] * block_size + p % block_size."""
        if not 0 <= position < self.num_tokens(seq_id):
            raise IndexError(f"position {position} is outside sequence {seq_id} ({self.num_tokens(seq_id)} tokens)")
        return self._tables[seq_id][position // self.block_size] * self.block_size + position % self.block_size

    @property
    def seq_ids(self) -> list[int]:
        return list(self._tables)

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def is_cached(self, block_id: int) -> bool:
        """Free, but its content is still findable by a prefix hit."""
        return block_id in self._evictable

    def stats(self) -> dict:
        """Pool occupancy and prefix-cache hits (counted in full blocks looked up)."""
        return {"total_blocks": self.num_blocks, "free_blocks": self.num_free_blocks,
                "used_blocks": sum(1 for b in self.blocks if b.ref_count > 0),
                "cached_blocks": len(self._evictable),
                "shared_blocks": sum(1 for b in self.blocks if b.ref_count > 1),
                "prefix_queries": self.prefix_queries, "prefix_hits": self.prefix_hits,
                "prefix_hit_rate": self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0}

    def snapshot(self) -> dict:
        """A plain-data picture of the pool (for the allocator view and its tests). A block's
        ``num_tokens`` is how many of its slots a table covers (a cached free block is full)."""
        bs, fill = self.block_size, [0] * self.num_blocks
        for block_id in self._evictable:
            fill[block_id] = bs
        for s, table in self._tables.items():
            for i, block_id in enumerate(table):
                fill[block_id] = max(fill[block_id], min(bs, self._num_tokens[s] - i * bs))
        return {"block_size": bs,
                "blocks": [{"id": b.block_id, "ref_count": b.ref_count, "cached": b.block_id in self._evictable,
                            "num_tokens": fill[b.block_id]} for b in self.blocks],
                "tables": {s: list(t) for s, t in self._tables.items()},
                "num_tokens": dict(self._num_tokens)}
