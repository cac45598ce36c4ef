"""The paged KV cache (PagedAttention, Kwon et al., SOSP'23): K/V live in fixed-size blocks.

Per layer, K and V each have shape ``[num_blocks, block_size, num_kv_heads, head_dim]``. A
sequence owns a *block table*, the list of its block ids; the K/V of its token at position ``p``
sit in block ``block_table[p // block_size]``, row ``p % block_size``. Flattened, that row is the
sequence's *slot* ``block_table[p // block_size] * block_size + p % block_size`` (vLLM's
``slot_mapping``). Blocks are handed out on demand by the block manager
(``inferlab.engine.block_manager``), so memory grows with the tokens actually generated instead of
a ``max_seq_len`` slab per sequence, and two sequences can share a block (a common prefix, the
``n`` completions of one prompt) until one of them writes to it (copy-on-write, ``copy_blocks``).
"""
from __future__ import annotations

import torch


class PagedKVCache:
    """K and V for every layer: ``k[layer]`` and ``v[layer]`` are ``[num_blocks, block_size, Hkv, D]``."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype=torch.float32, device="cpu"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a paged KV cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        # zeros, not empty: unused rows are masked out, but 0 * NaN would still poison a softmax @ V
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks, self.block_size = num_blocks, block_size
        # the same memory seen slot by slot, per layer: [num_blocks * block_size, Hkv, D]
        self.k_slots = [self.k[i].view(-1, num_kv_heads, head_dim) for i in range(num_layers)]
        self.v_slots = [self.v[i].view(-1, num_kv_heads, head_dim) for i in range(num_layers)]

    @classmethod
    def for_model(cls, config, num_blocks: int, block_size: int, dtype, device,
                  num_kv_heads: int | None = None) -> "PagedKVCache":
        """``num_kv_heads``: the KV heads this process holds (a tensor-parallel rank's share); default all."""
        return cls(config.num_hidden_layers, num_blocks, block_size, num_kv_heads or config.num_key_value_heads,
                   config.head_dim, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_block(config, block_size: int, dtype) -> int:
        """K and V of one block across all layers."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * elem

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor):
        """Store the K/V rows of N new tokens (k, v: [N, Hkv, D]) at their slots ([N] int);
        return the layer's K and V seen slot by slot ([num_blocks * block_size, Hkv, D] each)."""
        k_slots, v_slots = self.k_slots[layer], self.v_slots[layer]
        k_slots.index_copy_(0, slot_mapping, k)
        v_slots.index_copy_(0, slot_mapping, v)
        return k_slots, v_slots

    def gather(self, layer: int, block_table: torch.Tensor, length: int):
        """One sequence's first ``length`` K and V rows, each [length, Hkv, D], read through its table."""
        kc, vc = self.k[layer][block_table], self.v[layer][block_table]  # [nb, block_size, Hkv, D]
        return kc.flatten(0, 1)[:length], vc.flatten(0, 1)[:length]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: for each (src, dst) block pair, copy src's K/V rows into dst, in every layer."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.k.device)
        dst = torch.tensor([d for _, d in pairs], device=self.k.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
