"""Interfaces of the attention seam."""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

import torch


@dataclasses.dataclass
class AttentionMetadata:
    """What one forward pass tells every attention layer.

    positions:  [B, T] absolute position of each new token (drives RoPE).
    kv_cache:   where past K/V live, or None to attend only within this call.
    cache_start: first cache slot these T tokens are written to (contiguous cache).
    attn_mask:  [B, 1, T, S] bool (True = may attend), or None for the fast paths:
                causal within the call, or a single query seeing every cached slot.
    is_causal:  use SDPA's built-in causal mask (no cache or an empty one, no padding).
    """

    positions: torch.Tensor
    kv_cache: object | None = None
    cache_start: int = 0
    attn_mask: torch.Tensor | None = None
    is_causal: bool = True


class AttentionBackend(ABC):
    """Computes softmax(q k^T / sqrt(D)) v, storing this call's k and v where it keeps them."""

    @abstractmethod
    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [B, Hq, T, D], already rotated
        k: torch.Tensor,  # [B, Hkv, T, D], already rotated
        v: torch.Tensor,  # [B, Hkv, T, D]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [B, Hq, T, D]
        ...
