"""Graded tests for lab 02. `inferlab grade labs/02_kv_cache` runs them against starter.py;
with --reference they run against inferlab.engine.block_manager, the reference solution."""
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule, \
    run_state_machine_as_test

from inferlab import labkit

lab = labkit.implementation(__file__, reference="inferlab.engine.block_manager",
                            functions=["BlockManager", "NoFreeBlocksError"])


def prefilled(bm):
    """``allocate``, then the prompt's prefill runs: the allocator names a block for prefix hits
    only once its K/V is written (``cache_blocks``, which the engine calls after each step)."""
    def allocate(seq_id, token_ids):
        cached = bm.allocate(seq_id, token_ids)
        bm.cache_blocks(seq_id, list(token_ids))
        return cached
    return allocate


def books(bm, tables):
    """Reference counts and free blocks must agree with the block tables."""
    holders = [0] * bm.num_blocks
    for seq in tables:
        for b in bm.block_table(seq):
            holders[b] += 1
    refs = [bm.ref_count(b) for b in range(bm.num_blocks)]
    labkit.expect(refs == holders, "each block's ref_count must equal the number of tables holding it",
                  ref_counts=refs, tables_holding=holders)
    labkit.expect(bm.num_free_blocks == holders.count(0),
                  "num_free_blocks must count exactly the blocks no table holds",
                  num_free_blocks=bm.num_free_blocks, blocks_nobody_holds=holders.count(0))


def free_is(bm, expected, why):
    got = bm.num_free_blocks
    labkit.expect(got == expected, f"num_free_blocks should be {expected} {why}", num_free_blocks=got)


@labkit.points(2)
def test_allocate_gives_each_sequence_its_blocks():
    bm = lab.BlockManager(num_blocks=8, block_size=4)
    labkit.check(bm.allocate, 0, list(range(10)), expected=0)        # 10 tokens: 3 blocks
    labkit.check(bm.allocate, 1, [5, 6, 7, 8], expected=0)           # exactly one block
    t0, t1 = bm.block_table(0), bm.block_table(1)
    labkit.expect(len(t0) == 3 and len(t1) == 1, "ceil(tokens / block_size) blocks per sequence", tables=[t0, t1])
    labkit.expect(len(set(t0 + t1)) == 4, "two sequences must never get the same block", tables=[t0, t1])
    free_is(bm, 4, "after 4 of 8 blocks were handed out")
    labkit.expect(bm.can_allocate(16) and not bm.can_allocate(17), "can_allocate(n) needs ceil(n / 4) free blocks")
    books(bm, [0, 1])


@labkit.points(1)
def test_slot_mapping():
    bm = lab.BlockManager(num_blocks=8, block_size=4)
    bm.allocate(0, [1, 2, 3])
    bm.allocate(1, list(range(9)))
    table = bm.block_table(1)
    for p in range(9):
        labkit.check(bm.slot, 1, p, expected=table[p // 4] * 4 + p % 4)


@labkit.points(2)
def test_append_takes_a_block_only_when_full():
    bm = lab.BlockManager(num_blocks=4, block_size=4)
    bm.allocate(0, [1, 2, 3])
    for _ in range(5):
        labkit.check(bm.append_slot, 0, expected=[])
        labkit.expect(len(bm.block_table(0)) == -(-bm.num_tokens(0) // 4),
                      "a new block only when the last one is full", tokens=bm.num_tokens(0), table=bm.block_table(0))
    labkit.check(bm.num_tokens, 0, expected=8)
    free_is(bm, 2, "when 8 tokens fill 2 blocks of 4")


@labkit.points(2)
def test_free_returns_blocks_and_unknown_raises_keyerror():
    bm = lab.BlockManager(num_blocks=6, block_size=2)
    bm.allocate(0, [1, 2, 3])
    bm.allocate(1, [4, 5, 6, 7, 8])
    bm.free(0)
    free_is(bm, 3, "after freeing a 3-token sequence (2 blocks) of a 6-block pool holding 5 blocks")
    bm.free(1)
    free_is(bm, 6, "after freeing every sequence")
    for seq in (0, 7):
        with pytest.raises(KeyError):
            bm.free(seq)        # freeing twice must not put blocks on the free list twice
    free_is(bm, 6, "after a second free of the same sequence raised KeyError")
    bm.allocate(2, list(range(12)))   # all six blocks, each once
    labkit.expect(sorted(bm.block_table(2)) == list(range(6)), "every block handed out once", table=bm.block_table(2))


@labkit.points(2)
def test_out_of_blocks_changes_nothing():
    bm = lab.BlockManager(num_blocks=4, block_size=4)
    bm.allocate(0, list(range(9)))
    with pytest.raises(lab.NoFreeBlocksError):
        bm.allocate(1, list(range(5)))           # needs 2 blocks, 1 is free
    free_is(bm, 1, "after an allocate that raised NoFreeBlocksError (it must take nothing)")
    with pytest.raises(KeyError):
        bm.block_table(1)                        # nothing half-allocated
    bm.allocate(1, [1])
    for _ in range(3):
        bm.append_slot(0)
    with pytest.raises(lab.NoFreeBlocksError):
        bm.append_slot(0)
    labkit.check(bm.num_tokens, 0, expected=12)
    books(bm, [0, 1])


@labkit.points(3)
def test_fork_shares_and_copy_on_write():
    bm = lab.BlockManager(num_blocks=8, block_size=4)
    bm.allocate(0, [1, 2, 3, 4, 5, 6])
    bm.fork(0, 1)
    labkit.expect(bm.block_table(1) == bm.block_table(0), "a fork shares every block", tables=[bm.block_table(0)])
    books(bm, [0, 1])
    full, partial = bm.block_table(0)
    copies = bm.append_slot(1)
    labkit.expect(len(copies) == 1 and copies[0][0] == partial and copies[0][1] not in (full, partial),
                  "writing into a shared partly filled block copies it: [(shared, fresh)]", got=copies)
    labkit.expect(bm.block_table(1) == [full, copies[0][1]] and bm.block_table(0) == [full, partial],
                  "the writer's table points at the copy; the other table is unchanged",
                  parent=bm.block_table(0), child=bm.block_table(1))
    labkit.check(bm.append_slot, 0, expected=[])   # the parent holds its block alone now
    books(bm, [0, 1])
    bm.free(0)
    labkit.check(bm.ref_count, full, expected=1)


def kv(prefix):
    """Stand-in for a token's K/V: a function of the token and everything before it."""
    return hash(tuple(prefix))


class Allocator(RuleBasedStateMachine):
    """Random allocate / append / fork / free against a shadow cache: every slot holds the
    "K/V" of the token written there, and every sequence must always read its own."""
    caching = False
    seqs = Bundle("seqs")

    @initialize(num_blocks=st.integers(3, 16), block_size=st.sampled_from([1, 2, 4]))
    def setup(self, num_blocks, block_size):
        self.bm = lab.BlockManager(num_blocks, block_size, enable_prefix_caching=self.caching)
        self.tokens, self.shadow, self.next_id = {}, {}, 0

    @rule(target=seqs, shared=st.booleans(), suffix=st.lists(st.integers(0, 2), max_size=7))
    def allocate(self, shared, suffix):
        prompt = ([9, 8, 7, 6, 5] if shared else []) + suffix or [0]
        seq = self.next_id
        self.next_id += 1
        free_before = self.bm.num_free_blocks
        try:
            cached = self.bm.allocate(seq, prompt)
        except lab.NoFreeBlocksError:
            labkit.expect(self.bm.num_free_blocks == free_before, "a failed allocate must take no block")
            return multiple()
        bs = self.bm.block_size
        labkit.expect(cached % bs == 0 and 0 <= cached < len(prompt) and (self.caching or cached == 0),
                      "allocate returns a multiple of block_size below len(token_ids) (0 without caching)",
                      prompt=prompt, returned=cached)
        for p in range(cached):
            labkit.expect(self.shadow.get(self.bm.slot(seq, p)) == kv(prompt[:p + 1]),
                          "a prefix hit must point at blocks holding this prompt's own K/V", prompt=prompt, position=p)
        for p in range(cached, len(prompt)):
            self.shadow[self.bm.slot(seq, p)] = kv(prompt[:p + 1])
        self.bm.cache_blocks(seq, list(prompt))  # the prefill ran: its full blocks may be named now
        self.tokens[seq] = list(prompt)
        return seq

    @rule(seq=seqs, token=st.integers(0, 2))
    def append(self, seq, token):
        if seq not in self.tokens:
            return
        try:
            copies = self.bm.append_slot(seq)
        except lab.NoFreeBlocksError:
            return
        bs = self.bm.block_size
        for src, dst in copies:
            for j in range(bs):
                if src * bs + j in self.shadow:
                    self.shadow[dst * bs + j] = self.shadow[src * bs + j]
        self.tokens[seq].append(token)
        p = len(self.tokens[seq]) - 1
        written = self.bm.block_table(seq)[p // bs]
        labkit.expect(self.bm.ref_count(written) == 1, "never write into a block another table holds",
                      table=self.bm.block_table(seq), block=written)
        self.shadow[self.bm.slot(seq, p)] = kv(self.tokens[seq])
        self.bm.cache_blocks(seq, list(self.tokens[seq]))  # its K/V is written: a block it filled may be named

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        if parent not in self.tokens:
            return multiple()
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        return child

    @rule(seq=seqs)
    def free(self, seq):
        if seq in self.tokens:
            self.bm.free(seq)
            del self.tokens[seq]
        else:
            with pytest.raises(KeyError):
                self.bm.free(seq)

    @invariant()
    def consistent(self):
        if not hasattr(self, "bm"):
            return
        books(self.bm, list(self.tokens))
        for seq, toks in self.tokens.items():
            labkit.check(self.bm.num_tokens, seq, expected=len(toks))
            for p in range(len(toks)):
                labkit.expect(self.shadow.get(self.bm.slot(seq, p)) == kv(toks[:p + 1]),
                              "a sequence reads K/V another sequence wrote (missing copy-on-write, or a "
                              "block freed while still held)", seq=seq, position=p)


class CachingAllocator(Allocator):
    caching = True


MACHINE_SETTINGS = settings(max_examples=100, stateful_step_count=30, deadline=None, derandomize=True,
                            database=None)


@labkit.points(4)
def test_random_workloads_keep_the_books():
    run_state_machine_as_test(Allocator, settings=MACHINE_SETTINGS)


# ---- stretch: prefix caching ----------------------------------------------------------------

@labkit.points(2)
def test_prefix_caching_reuses_full_blocks():
    bm = lab.BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    system = [11, 12, 13, 14, 15, 16, 17, 18]
    labkit.check(prefilled(bm), 0, system + [1, 2], expected=0)
    labkit.check(prefilled(bm), 1, system + [3], expected=8)          # both full blocks found
    labkit.expect(bm.block_table(1)[:2] == bm.block_table(0)[:2], "a hit reuses the same physical blocks",
                  tables=[bm.block_table(0), bm.block_table(1)])
    labkit.check(prefilled(bm), 2, system, expected=4)                # one token must be computed
    labkit.check(prefilled(bm), 3, [11, 12, 13, 99] + system[4:] + [1], expected=0)   # chained: a different parent
    labkit.check(prefilled(bm), 4, system[:4] + [1, 2], expected=4)   # a partly filled block never matches
    books(bm, [0, 1, 2, 3, 4])


@labkit.points(2)
def test_freed_blocks_stay_cached_until_needed():
    bm = lab.BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    prefilled(bm)(0, [1, 2, 3])            # [1,2] full, [3] partial
    prefilled(bm)(1, [5, 6, 7])            # [5,6] full, [7] partial
    bm.free(0)
    bm.free(1)
    free_is(bm, 6, "when every block is free (cached-but-free blocks count as free)")
    prefilled(bm)(2, list(range(20, 30)))  # 5 blocks: the 4 empty ones first, then it must evict
    bm.free(2)                             # one cached block: the least recently freed, seq 0's [1,2]
    labkit.check(prefilled(bm), 3, [5, 6, 9], expected=2)  # seq 1's block survived and is revived
    labkit.check(prefilled(bm), 4, [1, 2, 9], expected=0)  # seq 0's was evicted
    books(bm, [3, 4])


@labkit.points(3)
def test_random_workloads_with_prefix_caching():
    run_state_machine_as_test(CachingAllocator, settings=MACHINE_SETTINGS)
