"""GQA/MQA conversion by mean-pooling K/V heads (Ainslie et al. 2023) and the KV arithmetic."""
from __future__ import annotations

import pytest
import torch

from inferlab import roofline
from inferlab.model.gqa import kv_bytes_per_token, max_seqs_in_budget, mean_pool_kv_heads
from inferlab.model.loader import load_checkpoint, save_checkpoint

from .checkpoints import VOCAB, save_variant

IDS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(8))


@pytest.fixture(scope="module")
def mha(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mha")
    save_variant("llama_mha_tied", folder)
    return load_checkpoint(folder, device="cpu")[0]


def test_pooling_to_the_same_head_count_changes_nothing(mha):
    with torch.no_grad():
        assert torch.equal(mean_pool_kv_heads(mha, 4)(IDS), mha(IDS))


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_pooling_heads_that_are_already_equal_is_exact(mha, kv_heads, tmp_path):
    """If the heads of each group already share K/V weights, MHA == its GQA/MQA conversion; the
    converted checkpoint also gives the same logits in transformers."""
    import transformers

    d = mha.config.head_dim
    group = 4 // kv_heads
    with torch.no_grad():
        for layer in mha.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                w = proj.weight.view(kv_heads, group, d, -1)
                w.copy_(w[:, :1].expand_as(w).clone())
        want = mha(IDS)
        pooled = mean_pool_kv_heads(mha, kv_heads)
        assert pooled.config.num_key_value_heads == kv_heads
        assert (pooled(IDS) - want).abs().max().item() <= 1e-5
        save_checkpoint(pooled, None, tmp_path / "pooled")
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "pooled").eval()
        assert (hf(IDS).logits - want).abs().max().item() <= 1e-4


def test_pooling_takes_the_mean_of_each_group(mha):
    pooled = mean_pool_kv_heads(mha, 2)
    d = mha.config.head_dim
    k = mha.model.layers[0].self_attn.k_proj.weight
    assert torch.allclose(pooled.model.layers[0].self_attn.k_proj.weight[:d], (k[:d] + k[d:2 * d]) / 2)
    with pytest.raises(ValueError, match="divide"):
        mean_pool_kv_heads(mha, 3)


def test_kv_bytes_agree_with_the_roofline_arithmetic(mha):
    cfg = mha.config
    assert kv_bytes_per_token(cfg) == roofline.kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                                                  cfg.head_dim, 2)
    assert max_seqs_in_budget(mean_pool_kv_heads(mha, 1).config, 2**20, 64) == 4 * max_seqs_in_budget(cfg, 2**20, 64)
