"""Reference backend: torch attention over a contiguous KV cache.

Prefill (many queries) uses ``scaled_dot_product_attention``. Decode (one query per sequence)
is written out as two small matmuls with the query heads grouped by the K/V head they share:
torch's fused CPU kernel is tuned for long query blocks, and on a single query it was ~100x
slower here than this plain version. Both read each cached K/V head once per group (GQA).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.attention.base import AttentionBackend, AttentionMetadata
from inferlab.attention.paged import PagedAttentionMetadata, paged_attention_forward


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """One query per sequence: q [B, Hq, 1, D], k/v [B, Hkv, S, D], mask [B, 1, 1, S] bool."""
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    qg = q.view(b, hkv, hq // hkv, d)  # the query heads that share one K/V head, side by side
    scores = (qg @ k.transpose(-1, -2)) * d**-0.5  # [B, Hkv, G, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).view(b, hq, 1, d)


class TorchSDPABackend(AttentionBackend):
    """torch attention over either cache: the contiguous one (``AttentionMetadata``) or the paged
    one (``PagedAttentionMetadata``, a ragged batch; see ``inferlab.attention.paged``)."""

    def forward(self, layer_idx, q, k, v, metadata: AttentionMetadata | PagedAttentionMetadata):
        if isinstance(metadata, PagedAttentionMetadata):
            return paged_attention_forward(layer_idx, q, k, v, metadata)
        cache = metadata.kv_cache
        if cache is not None:
            k, v = cache.update(layer_idx, k, v, metadata.cache_start)
        if q.shape[2] == 1:
            return decode_attention(q, k, v, metadata.attn_mask)
        gqa = q.shape[1] != k.shape[1]
        if metadata.attn_mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=metadata.attn_mask, enable_gqa=gqa)
        # no mask: the model found a plain causal call from an empty cache (see attention_mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
