"""The proposers' own products (EAGLE's fc and head, Medusa's blocks and guess rows, the cut draft's
head) run the f32 loop on a CPU, as the target's linears do: a row gets the same bits alone as
beside other rows, so a sequence's guesses do not depend on the batch it drafts in. MKL's GEMV
(one row) and GEMM (several) sum in different orders, and differ in the last bits."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from inferlab.model.config import ModelConfig
from inferlab.quant import f32

pytestmark = pytest.mark.skipif(f32.loop() is None, reason="the f32 loop does not run here (no compiler, or the loops are off)")


def _alone_and_beside(fn, x: torch.Tensor) -> None:
    with torch.inference_mode():
        together = fn(x)
        for i in range(len(x)):
            assert torch.equal(fn(x[i:i + 1])[0], together[i]), f"row {i} changed bits beside the others"


def test_eagle_fc_and_head_give_a_row_the_same_bits_in_any_batch():
    from inferlab.spec.eagle import EagleDraft

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    draft = EagleDraft(config, torch.arange(0, 256, 2))
    for p in draft.parameters():
        nn.init.normal_(p, std=0.2)
    _alone_and_beside(draft.fc, torch.randn(5, 128))
    _alone_and_beside(draft.logits, torch.randn(5, 64))


def test_medusa_blocks_and_guess_rows_give_a_row_the_same_bits_in_any_batch():
    from inferlab.spec.medusa import MedusaHeads

    torch.manual_seed(0)
    heads, head = MedusaHeads(64, 3), nn.Linear(64, 200, bias=False)
    for b in heads.blocks:
        nn.init.normal_(b.linear.weight, std=0.2)
    heads.guess_vocab = torch.arange(0, 192, 3)  # 64 rows: the loop takes a multiple of 4
    _alone_and_beside(heads.blocks[0], torch.randn(5, 64))
    hidden = torch.randn(5, 64)
    with torch.inference_mode():
        _, probs = heads.propose(hidden, head, 3, with_probs=True)
        for i in range(5):
            assert torch.equal(heads.propose(hidden[i:i + 1], head, 3, with_probs=True)[1][0], probs[i])


def test_the_cut_drafts_head_gives_a_row_the_same_bits_in_any_batch():
    from inferlab.spec.layer_draft import SubsetHead

    torch.manual_seed(0)
    head = SubsetHead(torch.randn(320, 64), torch.arange(0, 320, 2))  # 160 rows: the loop takes a multiple of 4
    _alone_and_beside(head.sub_logits, torch.randn(5, 64))
