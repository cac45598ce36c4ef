"""The vocabulary-parallel embedding on two ranks simulated in one process: each rank's all-reduce
adds the other rank's share, so no process group is needed (the biased linears: test_tp_bias.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.parallel.layers import vocab_parallel_embedding


def test_vocab_parallel_embedding_looks_up_each_id_in_its_owners_shard():
    """Rows [start, start + rows) of the table on each rank: an id is shifted into its shard's rows,
    and an id another rank owns contributes zeros."""
    table = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
    ids = torch.tensor([[0, 3, 4, 6, 2]])
    shards = [(table[:4], 0), (torch.cat([table[4:], torch.zeros(1, 3)]), 4)]  # 4 rows each, one padding row
    alone = [vocab_parallel_embedding(ids, w, s, all_reduce=lambda t: t) for w, s in shards]  # each share, unsummed
    for r, (w, start) in enumerate(shards):
        out = vocab_parallel_embedding(ids, w, start, all_reduce=lambda t: t + alone[1 - r])
        torch.testing.assert_close(out, F.embedding(ids, table), rtol=0, atol=0)
