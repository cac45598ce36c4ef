"""Short multi-query rows (a speculative verify: k guesses behind the last token, over a cached
context) computed for every sequence of a step at once equal the per-sequence SDPA path."""
from __future__ import annotations

import pytest
import torch

from inferlab.attention.paged import PagedAttentionMetadata, paged_attention_forward
from inferlab.cache.paged import PagedKVCache


@pytest.mark.parametrize("window", [None, 6])
def test_batched_multi_query_equals_per_sequence(window):
    torch.manual_seed(0)
    hq, hkv, d, bs = 4, 2, 8, 4
    q_lens, ctx = [1, 3, 5, 2, 4], [9, 7, 21, 3, 13]  # a decode, then four multi-query sequences
    cache = PagedKVCache(1, 32, bs, hkv, d)
    cache.k.normal_(), cache.v.normal_()  # cached context: whatever the earlier steps wrote
    tables, free = [], list(torch.randperm(32).tolist())
    for c in ctx:
        tables.append([free.pop() for _ in range(-(-c // bs))])
    width = max(len(t) for t in tables)
    n = sum(q_lens)
    slots = [t[p // bs] * bs + p % bs for t, q, c in zip(tables, q_lens, ctx) for p in range(c - q, c)]
    positions = [p for q, c in zip(q_lens, ctx) for p in range(c - q, c)]
    q, k, v = torch.randn(1, hq, n, d), torch.randn(1, hkv, n, d), torch.randn(1, hkv, n, d)

    def forward(num_multi_query):
        meta = PagedAttentionMetadata(
            positions=torch.tensor([positions]), kv_cache=cache, slot_mapping=torch.tensor(slots),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
            context_lens=torch.tensor(ctx), query_lens=q_lens, context_lens_host=ctx, num_decodes=1,
            num_multi_query=num_multi_query)
        meta.build_masks(window)
        return paged_attention_forward(0, q, k, v, meta)

    batched, looped = forward(4), forward(0)
    assert batched.shape == (1, hq, n, d)
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
