"""The block allocator against a model of its tables and a shadow of the K/V it stands for.

The shadow cache stores, for every physical slot, the "K/V" of the token written there; in a real
model a token's K/V depends on every token before it, so the shadow writes ``kv(tokens[:p + 1])``.
If any table ever reads a slot another sequence overwrote (a missing copy-on-write, a double free,
a wrong prefix hit), some sequence's positions stop matching their own prefix.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule

from inferlab.engine import BlockManager, NoFreeBlocksError

SYSTEM_PROMPTS = [[7, 7, 1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1], [1, 2]]


def kv(prefix) -> int:
    """Stand-in for a token's K/V: a function of the token and everything before it."""
    return hash(tuple(prefix))


class BlockManagerMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(num_blocks=st.integers(3, 20), block_size=st.sampled_from([1, 2, 4]), caching=st.booleans())
    def setup(self, num_blocks, block_size, caching):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.tokens: dict[int, list[int]] = {}       # the model: each live sequence's token ids
        self.shadow: dict[int, int] = {}             # physical slot -> K/V written there
        self.next_id = 0

    def _state(self):
        return (self.bm.stats(), {s: self.bm.block_table(s) for s in self.tokens},
                [(b.ref_count, b.hash, list(b.token_ids)) for b in self.bm.blocks])

    @rule(target=seqs, system=st.sampled_from([None, 0, 1, 2]),
          suffix=st.lists(st.integers(0, 3), min_size=0, max_size=9))
    def allocate(self, system, suffix):
        prompt = (SYSTEM_PROMPTS[system] if system is not None else []) + suffix
        prompt = prompt or [0]
        seq, before = self.next_id, self._state()
        self.next_id += 1
        try:
            cached = self.bm.allocate(seq, prompt)
        except NoFreeBlocksError:
            assert not self.bm.can_allocate(len(prompt)), "refused although can_allocate said yes"
            assert self._state() == before, "a failed allocate changed the pool"
            return multiple()                         # nothing to hand out
        bs = self.bm.block_size
        assert cached % bs == 0 and 0 <= cached <= len(prompt) - 1
        if not self.bm.enable_prefix_caching:
            assert cached == 0
        table = self.bm.block_table(seq)
        for i in range(cached // bs):                 # a prefix hit holds exactly the query's K/V
            assert self.bm.blocks[table[i]].token_ids == tuple(prompt[i * bs:(i + 1) * bs])
            for j in range(bs):
                p = i * bs + j
                assert self.shadow.get(table[i] * bs + j) == kv(prompt[:p + 1])
        for p in range(cached, len(prompt)):          # prefill computes the rest
            self.shadow[self.bm.slot(seq, p)] = kv(prompt[:p + 1])
        self.bm.cache_blocks(seq, list(prompt))        # written: its full blocks may be named now
        self.tokens[seq] = list(prompt)
        return seq

    @rule(seq=seqs, token=st.integers(0, 3))
    def append(self, seq, token):
        if seq not in self.tokens:
            return
        before = self._state()
        try:
            copies = self.bm.append_slot(seq)
        except NoFreeBlocksError:
            assert self.bm.num_free_blocks == 0
            assert self._state() == before, "a failed append changed the pool"
            return
        bs = self.bm.block_size
        for src, dst in copies:                       # the KV cache copies the rows
            assert self.bm.ref_count(dst) == 1 and self.bm.ref_count(src) >= 1
            for j in range(bs):
                if src * bs + j in self.shadow:
                    self.shadow[dst * bs + j] = self.shadow[src * bs + j]
        self.tokens[seq].append(token)
        p = len(self.tokens[seq]) - 1
        written = self.bm.block_table(seq)[p // bs]
        assert self.bm.ref_count(written) == 1, "a write into a block another table holds"
        self.shadow[self.bm.slot(seq, p)] = kv(self.tokens[seq])
        self.bm.cache_blocks(seq, list(self.tokens[seq]))

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        if parent not in self.tokens:
            return multiple()
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child)
        assert self.bm.block_table(child) == self.bm.block_table(parent)
        self.tokens[child] = list(self.tokens[parent])
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        if seq not in self.tokens:                    # freed already (through another bundle entry)
            with pytest.raises(KeyError):
                self.bm.free(seq)
            return
        self.bm.free(seq)
        del self.tokens[seq]
        with pytest.raises(KeyError):                 # a second free is an error, not a double free
            self.bm.free(seq)

    @invariant()
    def books_balance(self):
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        holders = [0] * bm.num_blocks
        for seq, tokens in self.tokens.items():
            table = bm.block_table(seq)
            assert bm.num_tokens(seq) == len(tokens)
            assert len(table) == -(-len(tokens) // bm.block_size)
            for b in table:
                holders[b] += 1
        assert [b.ref_count for b in bm.blocks] == holders, "reference counts differ from the tables"
        free = list(bm._free) + list(bm._evictable)
        assert len(free) == len(set(free)), "a block is on the free list twice"
        assert set(free) == {i for i, n in enumerate(holders) if n == 0}, "a block is both free and held"
        stats = bm.stats()
        assert stats["free_blocks"] + stats["used_blocks"] == stats["total_blocks"] == bm.num_blocks
        assert stats["shared_blocks"] == sum(n > 1 for n in holders)

    @invariant()
    def every_sequence_reads_its_own_kv(self):
        if not hasattr(self, "bm"):
            return
        for seq, tokens in self.tokens.items():
            for p in range(len(tokens)):
                assert self.shadow.get(self.bm.slot(seq, p)) == kv(tokens[:p + 1]), (seq, p)


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
TestBlockManagerMachine = BlockManagerMachine.TestCase


def test_out_of_blocks_allocates_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate(0, list(range(9)))                   # 3 blocks
    before = bm.stats()
    with pytest.raises(NoFreeBlocksError, match="needs 2 new KV blocks, 1 are free"):
        bm.allocate(1, list(range(5)))
    assert bm.stats() == before and bm.seq_ids == [0]
    bm.allocate(1, [1, 2, 3])                        # the last block still fits
    for _ in range(3):
        bm.append_slot(0)                            # fills block 3 of seq 0
    with pytest.raises(NoFreeBlocksError):
        bm.append_slot(0)                            # needs a 5th block
    assert bm.num_tokens(0) == 12 and len(bm.block_table(0)) == 3


def test_fork_then_append_copies_on_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate(0, [1, 2, 3, 4, 5, 6])               # blocks [0, 1], the second half full
    bm.fork(0, 1)
    assert bm.stats()["shared_blocks"] == 2
    assert bm.append_slot(1) == [(1, 2)]             # the child copies the shared partial block
    assert bm.block_table(1) == [0, 2] and bm.block_table(0) == [0, 1]
    assert bm.append_slot(0) == []                   # the parent now holds block 1 alone
    assert [bm.ref_count(b) for b in (0, 1, 2)] == [2, 1, 1]
    assert [b["num_tokens"] for b in bm.snapshot()["blocks"][:3]] == [4, 3, 3]
    assert bm.slot(1, 5) == 2 * 4 + 1


def test_full_shared_block_needs_no_copy():
    bm = BlockManager(num_blocks=8, block_size=2)
    bm.allocate(0, [1, 2, 3, 4])
    bm.fork(0, 1)
    assert bm.append_slot(1) == []                   # the token lands in a fresh block
    assert bm.block_table(1)[:2] == bm.block_table(0)


def test_prefix_hit_and_lru_eviction():
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    assert bm.allocate(0, [1, 2, 3, 4, 5]) == 0      # blocks 0,1 full, 2 partial
    bm.cache_blocks(0, [1, 2, 3, 4, 5])              # prefilled: blocks 0 and 1 are named
    assert bm.allocate(1, [1, 2, 3, 4, 9]) == 4      # shares blocks 0 and 1
    assert bm.block_table(1) == [0, 1, 3]
    assert bm.stats()["prefix_hits"] == 2 and bm.stats()["prefix_queries"] == 4
    assert bm.allocate(2, [1, 2, 3, 4]) == 2         # at least one token is computed
    bm.cache_blocks(1, [1, 2, 3, 4, 9]), bm.cache_blocks(2, [1, 2, 3, 4])
    bm.free(0), bm.free(1), bm.free(2)
    assert bm.stats()["cached_blocks"] == 2 and bm.num_free_blocks == 6
    assert list(bm._evictable) == [1, 0]             # least recently used first
    bm.allocate(3, [7] * 10)                         # 4 empty blocks, then evicts block 1
    assert bm.is_cached(0) and not bm.is_cached(1)   # (block 3 was never computed: not named)
    bm.free(3)
    assert bm.allocate(4, [1, 2, 3, 4, 5]) == 2      # block 0 revived; block 1's content is gone
    assert bm.block_table(4)[0] == 0


def test_partly_filled_block_is_never_matched():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    bm.allocate(0, [1, 2, 3, 4, 5, 6])
    bm.cache_blocks(0, [1, 2, 3, 4, 5, 6])
    bm.free(0)
    assert bm.allocate(1, [1, 2, 3, 4, 5, 6, 7]) == 4


def test_a_block_is_named_only_once_its_kv_is_written():
    """Preempted before its step ran, a sequence leaves nothing findable: the next prompt with the
    same prefix computes it again instead of reading slots nobody wrote."""
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    bm.allocate(0, [1, 2, 3, 4, 5])
    for _ in range(4):
        bm.append_slot(0)                            # blocks 0 and 1 full of reserved slots
    bm.cache_blocks(0, [1, 2, 3])                    # the step computed 3 tokens: no block is whole
    assert bm.stats()["cached_blocks"] == 0 and not bm._hash_to_block
    bm.free(0)                                       # preempted
    assert bm.allocate(1, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 0 and bm.num_free_blocks == 5
    bm.cache_blocks(1, [1, 2, 3, 4, 5, 6])           # 6 computed: block 0 only
    bm.free(1)
    assert bm.allocate(2, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 4
    bm.cache_blocks(2, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.fork(2, 3)                                    # a child names nothing twice
    bm.cache_blocks(3, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(bm._hash_to_block) == 2


def test_bad_inputs():
    bm = BlockManager(num_blocks=2, block_size=2)
    with pytest.raises(KeyError):
        bm.free(3)
    bm.allocate(0, [1])
    with pytest.raises(ValueError, match="already has a block table"):
        bm.allocate(0, [1])
    with pytest.raises(ValueError, match="empty prompt"):
        bm.allocate(1, [])
    with pytest.raises(IndexError):
        bm.slot(0, 1)
    with pytest.raises(ValueError, match="must be >= 1"):
        BlockManager(0, 16)
