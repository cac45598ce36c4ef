"""Interfaces of the attention seam, and the one function that decides who may attend to whom."""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

import torch


@dataclasses.dataclass
class AttentionMetadata:
    """What one forward pass tells every attention layer.

    positions:   [B, T] absolute position of each new token (drives RoPE).
    kv_cache:    where past K/V live, or None to attend only within this call.
    cache_start: first cache slot these T tokens are written to (contiguous cache): the T new
                 queries are the *last* T of the cache_start + T keys.
    key_mask:    [B, S >= cache_start + T] bool, False at slots that hold left padding; or None.
    attn_mask:   [B, 1, T, S] bool (True = may attend). Leave it None: the model builds it once
                 per forward from the fields above (see :func:`attention_mask`).
    """

    positions: torch.Tensor
    kv_cache: object | None = None
    cache_start: int = 0
    key_mask: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None


def attention_mask(q_len: int, cache_start: int, key_mask: torch.Tensor | None = None,
                   sliding_window: int | None = None, device=None) -> torch.Tensor | None:
    """Boolean mask [B or 1, 1, T, S] (S = cache_start + T), or None where no mask is needed.

    Causal *bottom-right*, as FlashAttention-2 defines it: query i is the token at slot
    cache_start + i and sees slots j <= cache_start + i. (SDPA's ``is_causal`` aligns top-left,
    which is right only when the cache was empty.) A sliding window (Mistral) further hides slots
    j <= cache_start + i - window. Left-padding slots are hidden, but every query keeps its own
    slot so a padding row never softmaxes over nothing.
    None means: a plain causal call from an empty cache (SDPA's fast ``is_causal`` path) or a single
    query that sees every slot.
    """
    total = cache_start + q_len
    window_bites = sliding_window is not None and total > sliding_window
    if key_mask is None and not window_bites and (cache_start == 0 or q_len == 1):
        return None
    slots = torch.arange(total, device=device)
    q_slot = slots[cache_start:, None]  # [T, 1]
    mask = slots[None, :] <= q_slot  # [T, S]
    if window_bites:
        mask &= slots[None, :] > q_slot - sliding_window
    mask = mask[None, None]
    if key_mask is not None:
        mask = (mask & key_mask[:, None, None, :total]) | (slots[None, :] == q_slot)[None, None]
    return mask


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
