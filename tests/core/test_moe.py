"""Mixtral-style MoE: both checkpoint forms, the saved form, routing and the load-balancing loss,
each against transformers (the parity suite in test_parity.py covers the hub form end to end)."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from inferlab.model import moe
from inferlab.model.loader import load_checkpoint, save_checkpoint

from .checkpoints import VOCAB, save_variant


@pytest.fixture(scope="module")
def hf_and_ids(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fused")
    hf = save_variant("mixtral_top2", folder, original_format=False)
    ids = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = hf(ids).logits
    return hf, folder, ids, expected


def test_fused_expert_checkpoint_matches_transformers(hf_and_ids):
    _, folder, ids, expected = hf_and_ids
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert any(k.endswith("mlp.experts.gate_up_proj") for k in f.keys())  # transformers 5's fused form
    ours, _ = load_checkpoint(folder, device="cpu")
    with torch.no_grad():
        assert (ours(ids) - expected).abs().max().item() <= 1e-4


def test_saved_mixtral_loads_in_transformers(hf_and_ids, tmp_path):
    import transformers

    _, folder, ids, expected = hf_and_ids
    ours, _ = load_checkpoint(folder, device="cpu")
    save_checkpoint(ours, None, tmp_path / "saved")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        assert (back(ids).logits - expected).abs().max().item() <= 1e-4
    assert sum(p.numel() for p in back.parameters()) == ours.num_parameters() == ours.config.num_params_hint


def test_router_logits_and_routing_match_transformers(hf_and_ids):
    hf, folder, ids, _ = hf_and_ids
    ours, _ = load_checkpoint(folder, device="cpu")
    x = torch.randn(50, hf.config.hidden_size, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref_logits, ref_w, ref_idx = hf.model.layers[0].mlp.gate(x)
        block = moe.moe_blocks(ours)[0]
        block(x[None])
        w, idx = moe.route(block.router_logits, 2)
    assert (block.router_logits - ref_logits).abs().max().item() <= 1e-5
    assert torch.equal(idx, ref_idx) and (w - ref_w).abs().max().item() <= 1e-6


@pytest.mark.parametrize("num_experts,top_k", [(4, 2), (8, 1), (3, 3)])
def test_load_balancing_loss_matches_transformers(num_experts, top_k):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    gen = torch.Generator().manual_seed(num_experts)
    logits = tuple(torch.randn(40, num_experts, generator=gen) * 3 for _ in range(3))
    got = moe.load_balancing_loss(logits, num_experts, top_k)
    assert abs(got.item() - load_balancing_loss_func(logits, num_experts, top_k).item()) <= 1e-5
    uniform = moe.load_balancing_loss([torch.zeros(40, num_experts)], num_experts, top_k)
    assert uniform.item() == pytest.approx(top_k, abs=1e-5)  # uniform routing: the minimum, k


def test_expert_load_sums_to_one():
    load = moe.expert_load(torch.randn(64, 6, generator=torch.Generator().manual_seed(7)), 6, 2)
    assert load.shape == (6,) and load.sum().item() == pytest.approx(1.0)
