"""Distillation's loss is KL(p_target || q_draft), and shipping keeps the draft folder's other files."""
from __future__ import annotations

import json
import shutil

import torch

from inferlab.loader import ASSETS, load_checkpoint
from inferlab.spec.distill import distill_loss, ship


def test_loss_is_the_forward_kl_per_position():
    g = torch.Generator().manual_seed(0)
    d, t = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    p, q = t.softmax(-1), d.softmax(-1)
    want = (p * (p.log() - q.log())).sum(-1).mean()
    assert torch.allclose(distill_loss(d, t), want, atol=1e-6)
    assert distill_loss(t, t).abs() < 1e-6
    # forward, not reverse: KL(q || p) differs on these rows
    assert not torch.allclose(distill_loss(d, t), (q * (q.log() - p.log())).sum(-1).mean(), atol=1e-3)


def test_ship_keeps_the_card_and_records_the_run(tmp_path):
    out = tmp_path / "draft"
    shutil.copytree(ASSETS / "draft", out)
    draft, tok = load_checkpoint(out, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        draft.model.norm.weight.mul_(1.5)
    summary = {"before": {"draft_target_agreement": 0.47, "test_ppl": 39.9},
               "after": {"draft_target_agreement": 0.5, "test_ppl": 38.0}, "eval_tokens": None}
    ship(draft, tok, summary, out)
    assert (out / "README.md").read_text() == (ASSETS / "draft" / "README.md").read_text()
    assert (out / "tokenizer_config.json").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert m["distillation"] == summary and m["draft_target_agreement_before_distillation"] == 0.47
    assert m["draft_target_agreement"] == 0.5 and m["test_ppl"] == 38.0  # whole split: the card's figures
    again, _ = load_checkpoint(out, device="cpu", dtype=torch.float32)
    assert torch.allclose(again.model.norm.weight, draft.model.norm.weight, atol=1e-3)
