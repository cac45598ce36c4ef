"""Rotary position embeddings (RoPE, Su et al. 2021) with the HF scalings inferlab supports.

Each pair of channels (i, i + D/2) of q and k is rotated by the angle ``position * inv_freq[i]``,
so the dot product q.k depends only on the distance between the two positions.
Scalings stretch the wavelengths to reach longer contexts than the model was trained on:
``linear`` divides every frequency by ``factor`` (position interpolation, Chen et al. 2023);
``llama3`` keeps high frequencies, divides low ones by ``factor`` and blends in between.
"""
from __future__ import annotations

import math

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """The per-channel-pair rotation frequencies, shape [head_dim // 2], fp32, on the CPU (a model
    moves them with itself; built on meta, they would cost a second: see ``llama.on_meta``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim))
    if scaling is None:
        return inv_freq.float()
    kind = scaling["rope_type"]
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / factor).float()
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, blended, scaled).float()
    raise ValueError(f"unknown rope_type {kind!r}")


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos and sin for ``positions`` [B, T] -> each [B, 1, T, head_dim] (broadcast over heads)."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, H, T, D] by the angles in cos/sin (the "rotate half" layout of HF Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
