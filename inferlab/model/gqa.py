"""Fewer key/value heads: what GQA and MQA save, and how to convert a trained MHA model.

Multi-head attention (MHA) caches one key and one value vector per head, per layer, per token.
Multi-query attention (MQA, Shazeer 2019) keeps a single K/V head shared by all query heads;
grouped-query attention (GQA, Ainslie et al. 2023) sits between: ``Hkv`` K/V heads, each shared
by ``Hq / Hkv`` query heads. The KV cache shrinks by ``Hq / Hkv``, so a fixed KV memory budget
holds that many times more sequences, and each decode step reads that many fewer cache bytes.

A trained MHA checkpoint converts to GQA by *mean-pooling* the key and value projections of the
heads in each group (Ainslie et al. 2023, section 2.1); quality drops, and a short *uptraining*
(about 5% of the original steps) recovers most of it.
"""
from __future__ import annotations

import dataclasses

import torch

from inferlab.model.config import ModelConfig
from inferlab.model import CausalLM


def kv_bytes_per_token(cfg: ModelConfig, bytes_per_value: int = 2) -> int:
    """K and V, every layer: 2 * layers * kv_heads * head_dim * bytes (fp16/bf16 cache by default)."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * bytes_per_value


def max_seqs_in_budget(cfg: ModelConfig, budget_bytes: int, seq_len: int, bytes_per_value: int = 2) -> int:
    """How many sequences of ``seq_len`` tokens fit their whole KV cache in ``budget_bytes``."""
    return budget_bytes // (kv_bytes_per_token(cfg, bytes_per_value) * seq_len)


def _pool_heads(weight: torch.Tensor, num_heads: int, num_groups: int, head_dim: int) -> torch.Tensor:
    """[num_heads * head_dim, ...] -> [num_groups * head_dim, ...]: the mean of each group's heads."""
    rest = weight.shape[1:]
    return weight.reshape(num_groups, num_heads // num_groups, head_dim, *rest).mean(dim=1).reshape(-1, *rest)


@torch.no_grad()
def mean_pool_kv_heads(model: CausalLM, num_kv_heads: int) -> CausalLM:
    """A copy of ``model`` with ``num_kv_heads`` K/V heads, each the mean of the heads it replaces
    (consecutive heads form a group, matching how GQA shares K/V: query head h reads K/V head
    ``h // (Hq / Hkv)``). Everything else is copied unchanged."""
    cfg = model.config
    if num_kv_heads < 1 or cfg.num_key_value_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads must divide the model's {cfg.num_key_value_heads} K/V heads, got {num_kv_heads}")
    new = CausalLM(dataclasses.replace(cfg, num_key_value_heads=num_kv_heads)).to(model.device, model.dtype)
    state = model.checkpoint_state_dict()
    for key, value in state.items():
        if key.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            state[key] = _pool_heads(value, cfg.num_key_value_heads, num_kv_heads, cfg.head_dim)
    new.load_state_dict(state, strict=not cfg.tie_word_embeddings)
    new.tie_weights()
    return new.eval()
