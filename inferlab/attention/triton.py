"""The Triton backend: the kernels of ``kernels/`` behind the attention seam.

``LLM(model=..., attention_backend="triton")``. Same caches and metadata as the torch backend,
different kernels:

- a ragged batch over the paged cache (``PagedAttentionMetadata``): K/V are written through
  ``slot_mapping`` as before; the decodes of the step run as *one* ``paged_attention`` launch
  (Flash-Decoding over the block tables); the short multi-query rows of speculative verification
  run as one more ``paged_attention`` launch, each query row a "sequence" of its own that shares
  its sequence's block table and sees the keys up to its position (causal by context length);
  each prompt or prompt chunk runs ``flash_attention``,
  causal bottom-right, over its own K/V (a fresh prompt) or its K/V gathered through its block
  table (a chunk after cached tokens, a prefix-cache hit);
- the contiguous cache (``AttentionMetadata``): ``flash_attention`` for a causal prompt,
  ``flash_decoding`` for one query per sequence.

Where these kernels do not apply (a Mistral sliding window that hides early keys, left padding
in the contiguous path) that call runs the torch backend's code instead. On a CPU the kernels
run through Triton's interpreter: exact, and about a thousand times slower than compiled.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.attention.base import AttentionMetadata
from inferlab.attention.paged import (PagedAttentionMetadata, paged_attention_forward, torch_decode,
                                      torch_multi_query, torch_prefill)
from inferlab.attention.torch_sdpa import TorchSDPABackend, decode_attention


def _decode_window_bites(meta: PagedAttentionMetadata) -> bool:
    """True when a sliding window hides some decode's first key (slot 0 is otherwise always
    visible), read once per forward and kept on the metadata every layer shares."""
    if not hasattr(meta, "_triton_decode_window"):
        bias = meta.decode_mask
        meta._triton_decode_window = bias is not None and bool((bias[:, 0, 0, 0] == float("-inf")).any())
    return meta._triton_decode_window


def _multi_query_rows(meta: PagedAttentionMetadata):
    """(block_tables [T, W], context_lens [T]) of the multi-query rows, one per query row; built once
    per forward and kept on the metadata every layer shares. None under a sliding window."""
    if not hasattr(meta, "_triton_multi_query"):
        rows = None
        d, m = meta.num_decodes, meta.num_multi_query
        window = meta.sliding_window
        if window is None or max(meta.context_lens_host[d:d + m]) <= window:
            seqs, lens = [], []
            for j, (q, c) in enumerate(zip(meta.query_lens[d:d + m], meta.context_lens_host[d:d + m])):
                seqs += [d + j] * q
                lens += range(c - q + 1, c + 1)
            device = meta.block_tables.device
            rows = (meta.block_tables.index_select(0, torch.tensor(seqs, device=device)),
                    torch.tensor(lens, dtype=meta.context_lens.dtype, device=device))
        meta._triton_multi_query = rows
    return meta._triton_multi_query


class TritonBackend(TorchSDPABackend):
    def __init__(self):
        # imported here, not at module load: the kernels package picks Triton's interpreter on a
        # machine without CUDA, and only a user of this backend should pay for importing triton
        from inferlab.kernels.flash_attention import flash_attention
        from inferlab.kernels.flash_decoding import flash_decoding
        from inferlab.kernels.paged_attention import paged_attention

        self.flash_attention, self.flash_decoding, self.paged_attention = flash_attention, flash_decoding, paged_attention

    def forward(self, layer_idx, q, k, v, metadata: AttentionMetadata | PagedAttentionMetadata):
        if isinstance(metadata, PagedAttentionMetadata):
            return self._paged(layer_idx, q, k, v, metadata)
        return self._contiguous(layer_idx, q, k, v, metadata)

    def _paged(self, layer_idx, q, k, v, meta: PagedAttentionMetadata):
        """q [1, Hq, N, D], k/v [1, Hkv, N, D]: the new tokens of every sequence, decodes first. The
        engine's paged path, with the kernels plugged into its decode and prefill hooks."""
        return paged_attention_forward(layer_idx, q, k, v, meta, decode_fn=self._decode, prefill_fn=self._prefill,
                                       multi_query_fn=self._multi_query)

    def _decode(self, q, layer_idx: int, meta: PagedAttentionMetadata):
        if _decode_window_bites(meta):  # a sliding window hides early keys: the torch code handles it
            return torch_decode(q, layer_idx, meta)
        cache, d = meta.kv_cache, q.shape[0]  # the kernel reads the blocks in place: [num_blocks, block_size, Hkv, D]
        return self.paged_attention(q, cache.k[layer_idx], cache.v[layer_idx], meta.block_tables[:d],
                                    meta.context_lens[:d])

    def _multi_query(self, q, layer_idx: int, meta: PagedAttentionMetadata):
        """q [Hq, T, D]: the T query rows of the multi-query sequences, one ``paged_attention``
        launch over them. Row i of a sequence with q new tokens and context c attends to keys
        0..c - q + i: the decode kernel with that context length is exactly the causal mask."""
        rows = _multi_query_rows(meta)
        if rows is None:  # a sliding window: the torch code builds the bias
            return torch_multi_query(q, layer_idx, meta)
        tables, lens = rows
        cache = meta.kv_cache
        out = self.paged_attention(q.transpose(0, 1).contiguous(), cache.k[layer_idx], cache.v[layer_idx], tables, lens)
        return out.transpose(0, 1)

    def _prefill(self, q, k, v, mask):
        if mask is not None and not bool(mask[0, 0, -1, 0]):  # a sliding window hides early keys
            return torch_prefill(q, k, v, mask)
        return self.flash_attention(q, k, v, causal=True)  # the T queries are the last of S keys: bottom-right

    def _contiguous(self, layer_idx, q, k, v, meta: AttentionMetadata):
        if meta.kv_cache is not None:
            k, v = meta.kv_cache.update(layer_idx, k, v, meta.cache_start)
        if meta.attn_mask is not None:  # left padding or a window: the torch code handles any mask
            if q.shape[2] == 1:
                return decode_attention(q, k, v, meta.attn_mask)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=meta.attn_mask, enable_gqa=q.shape[1] != k.shape[1])
        if q.shape[2] == 1:  # one query per sequence that sees every cached key
            lens = torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)
            return self.flash_decoding(q[:, :, 0], k, v, lens)[:, :, None]
        return self.flash_attention(q, k, v, causal=True)
