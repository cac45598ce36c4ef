"""The contiguous KV cache: one preallocated slab per layer.

Each sequence reserves ``max_seq_len`` slots up front, whether it uses them or not. That is what
HF transformers and FasterTransformer-style engines do, and it is the waste PagedAttention
(Kwon et al., SOSP'23) removes: reserved-but-unused slots are 60-80% of KV memory in their study.
"""
from __future__ import annotations

import torch


class ContiguousKVCache:
    """K and V for ``num_layers`` layers, shape [batch, num_kv_heads, max_seq_len, head_dim] each."""

    def __init__(self, num_layers, batch_size, num_kv_heads, max_seq_len, head_dim,
                 dtype=torch.float32, device="cpu"):
        shape = (num_layers, batch_size, num_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len

    @classmethod
    def for_model(cls, config, batch_size: int, max_seq_len: int, dtype, device):
        return cls(config.num_hidden_layers, batch_size, config.num_key_value_heads,
                   max_seq_len, config.head_dim, dtype=dtype, device=device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        """Write this step's k/v at slots [start, start+T) and return views of slots [0, start+T)."""
        end = start + k.shape[2]
        if end > self.max_seq_len:
            raise ValueError(f"KV cache full: {end} tokens > max_seq_len {self.max_seq_len}")
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
