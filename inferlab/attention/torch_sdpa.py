"""Reference backend: torch's scaled_dot_product_attention over a contiguous KV cache."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.attention.base import AttentionBackend, AttentionMetadata


class TorchSDPABackend(AttentionBackend):
    def forward(self, layer_idx, q, k, v, metadata: AttentionMetadata):
        cache = metadata.kv_cache
        if cache is not None:
            k, v = cache.update(layer_idx, k, v, metadata.cache_start)
        gqa = q.shape[1] != k.shape[1]
        if metadata.attn_mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=metadata.attn_mask, enable_gqa=gqa)
        causal = metadata.is_causal and q.shape[2] > 1
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
