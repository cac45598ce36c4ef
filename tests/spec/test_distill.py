"""Distillation's loss is KL(p_target || q_draft), and shipping keeps the draft folder's other files."""
from __future__ import annotations

import json

import torch

from inferlab.model.loader import ASSETS, load_checkpoint
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


def test_ship_writes_its_own_folder_and_card(tmp_path):
    out = tmp_path / "draft_distilled"
    draft, tok = load_checkpoint(ASSETS / "draft", device="cpu", dtype=torch.float32)
    with torch.no_grad():
        draft.model.norm.weight.mul_(1.5)
    summary = {"steps": 3, "batch_size": 2, "seq_len": 16, "tokens_seen": 96, "lr": 1e-3, "seed": 0,
               "before": {"draft_target_agreement": 0.47, "test_ppl": 39.9, "tokens": 100},
               "after": {"draft_target_agreement": 0.5, "test_ppl": 38.0, "tokens": 100}, "eval_tokens": None}
    ship(draft, tok, summary, out)
    m = json.loads((out / "metrics.json").read_text())
    assert m["distillation"] == summary and m["distilled_from"] == "draft"
    assert m["draft_target_agreement"] == 0.5 and m["test_ppl"] == 38.0  # whole split: the card's figures
    card = (out / "README.md").read_text()
    assert "47.0%" in card and "50.0%" in card
    assert (out / "tokenizer_config.json").read_text() == (ASSETS / "draft" / "tokenizer_config.json").read_text()
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in out.iterdir())
    again, _ = load_checkpoint(out, device="cpu", dtype=torch.float32)
    assert torch.allclose(again.model.norm.weight, draft.model.norm.weight, atol=1e-3)
    # a partial measurement is recorded but never becomes the card's headline figures
    ship(draft, tok, {**summary, "eval_tokens": 50}, tmp_path / "partial")
    assert "test_ppl" not in json.loads((tmp_path / "partial" / "metrics.json").read_text())


def test_shipped_distilled_draft_agrees_with_the_target_more_often():
    """On held-out code, the distilled draft's greedy choice matches the target's more often than
    the plain draft's (its card: 51.4% vs 47.0% on the whole test split)."""
    from inferlab.eval.ppl import evaluate, test_stream
    from inferlab.embedded import list_models

    target, tok = load_checkpoint("target", device="cpu", dtype=torch.float32)
    ids = test_stream(tok, max_files=3)
    agree = {}
    for name in ("draft", "draft_distilled"):
        model, _ = load_checkpoint(name, device="cpu", dtype=torch.float32)
        agree[name] = evaluate(model, ids, reference=target, max_tokens=6000)["agreement"]
    assert agree["draft_distilled"] > agree["draft"] + 0.02, agree
    listed = {m["name"]: m for m in list_models()}
    assert listed["draft_distilled"]["draft_target_agreement"] > listed["draft"]["draft_target_agreement"]
