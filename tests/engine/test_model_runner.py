"""The ragged batch over the paged cache gives the logits of the contiguous reference path.

Checkpoints are transformers-saved tiny models (GQA, MQA, Mistral with a sliding window of 8),
and sequences run longer than the window so the window bites in decode and in chunked prefill.
"""
from __future__ import annotations

import pytest
import torch

from inferlab.attention import AttentionMetadata
from inferlab.cache import ContiguousKVCache, PagedKVCache
from inferlab.engine import BlockManager
from inferlab.engine.model_runner import ModelRunner, SeqInput
from inferlab.model.loader import load_checkpoint

from core.checkpoints import VOCAB, save_variant

TOL = 1e-4


@pytest.fixture(scope="module", params=["llama_gqa", "llama_mqa", "mistral_window8"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_variant(request.param, folder)
    return load_checkpoint(folder, device="cpu")[0]


def contiguous_logits(model, ids: list[int], splits: list[int]) -> torch.Tensor:
    """The reference: the contiguous cache, run in the same chunks, one sequence alone."""
    cache = ContiguousKVCache.for_model(model.config, 1, len(ids), torch.float32, "cpu")
    x, start, parts = torch.tensor([ids]), 0, []
    with torch.no_grad():
        for end in splits:
            meta = AttentionMetadata(torch.arange(start, end)[None], kv_cache=cache, cache_start=start)
            parts.append(model(x[:, start:end], meta)[0])
            start = end
    return torch.cat(parts)


class Harness:
    """A block manager + paged cache + runner, and the bookkeeping a scheduler would do."""

    def __init__(self, model, num_blocks=64, block_size=4):
        self.bm = BlockManager(num_blocks, block_size)
        self.runner = ModelRunner(model, PagedKVCache.for_model(model.config, num_blocks, block_size,
                                                                torch.float32, "cpu"))
        self.done: dict[int, int] = {}

    def step(self, work: dict[int, tuple[list[int], int]], all_logits=True):
        """work: seq_id -> (all token ids, how many new tokens to compute now)."""
        inputs = []
        for sid, (ids, k) in work.items():
            start = self.done.get(sid, 0)
            if sid not in self.done:
                self.bm.allocate(sid, ids[:start + k])
            else:
                for _ in range(start + k - self.bm.num_tokens(sid)):
                    assert self.bm.append_slot(sid) == []
            inputs.append(SeqInput(ids[start:start + k], start, self.bm.block_table(sid)))
            self.done[sid] = start + k
        return self.runner.execute(inputs, all_logits=all_logits)


def test_prefill_one_sequence(model):
    ids = torch.randint(0, VOCAB, (23,), generator=torch.Generator().manual_seed(0)).tolist()
    h = Harness(model)
    rows = h.step({0: (ids, 23)})[0]
    assert (rows - contiguous_logits(model, ids, [23])).abs().max() <= TOL
    last = Harness(model).step({0: (ids, 23)}, all_logits=False)
    assert last.shape == (1, VOCAB) and (last[0] - rows[-1]).abs().max() <= TOL


def test_decode_many_and_mixed_steps(model):
    """Five sequences of different lengths: staggered prefills, chunks and decodes in shared forwards."""
    gen = torch.Generator().manual_seed(1)
    seqs = {i: torch.randint(0, VOCAB, (n,), generator=gen).tolist() for i, n in enumerate([30, 17, 27, 10, 23])}
    plan = [  # each step: seq -> new tokens (a mix of prefill, chunk and decode)
        {0: 12, 1: 5},              # two prefill chunks
        {0: 1, 1: 1, 2: 13},        # two decodes and a new prefill
        {0: 9, 1: 1, 2: 1, 3: 9},   # a chunk, decodes, a whole prompt
        {0: 1, 1: 1, 2: 7, 3: 1, 4: 20},
        {0: 1, 1: 9, 2: 1, 4: 1},
        {0: 6, 2: 4, 4: 1},
        {2: 1, 4: 1},
    ]
    h = Harness(model)
    got = {i: [] for i in seqs}
    splits = {i: [] for i in seqs}
    for step in plan:
        rows = h.step({i: (seqs[i], k) for i, k in step.items()})
        for (i, _), r in zip(step.items(), rows):
            got[i].append(r)
            splits[i].append(h.done[i])
    for i, ids in seqs.items():
        assert splits[i][-1] == len(ids), i
        ref = contiguous_logits(model, ids, splits[i])
        assert (torch.cat(got[i]) - ref).abs().max() <= TOL, i
        full = model(torch.tensor([ids]))[0]  # and the no-cache forward
        assert (torch.cat(got[i]) - full).abs().max() <= TOL, i


def test_copy_on_write_fork_keeps_the_parent(model):
    """Two forks of one prompt write different next tokens into a shared last block."""
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, VOCAB, (10,), generator=gen).tolist()
    h = Harness(model)
    h.step({0: (prompt, 10)})
    h.bm.fork(0, 1)
    h.done[1] = 10
    a, b = prompt + [5], prompt + [77]
    copies = h.bm.append_slot(0) + h.bm.append_slot(1)
    assert len(copies) == 1  # the first writer copies the shared block, the second owns the original
    inputs = [SeqInput([5], 10, h.bm.block_table(0)), SeqInput([77], 10, h.bm.block_table(1))]
    logits = h.runner.execute(inputs, copies)
    for row, ids in zip(logits, (a, b)):
        assert (row - model(torch.tensor([ids]))[0, -1]).abs().max() <= TOL
