"""A draft cut from the target (``inferlab.spec.layer_draft``) and its distillation
(``inferlab.spec.draft_train``): cut with every layer and the whole vocabulary it *is* the target,
it shares the target's embedding (one tensor), its head gives q = 0 off the draft vocabulary,
it survives save and load, through the engine its greedy outputs are plain decoding's, and
distillation raises its held-out agreement with the target."""
from __future__ import annotations

import json

import pytest
import torch

from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.errors import InferlabError
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams, probs_from_logits
from inferlab.spec import draft_train, layer_draft


@pytest.fixture(scope="module")
def toy():
    model, tok = load_checkpoint("target", device="cpu", dtype=torch.float32)
    return model.eval().requires_grad_(False), tok


def _ids(n=12, seed=0):
    return torch.randint(3, 200, (1, n), generator=torch.Generator().manual_seed(seed))


def test_cut_with_every_layer_and_token_is_the_target(toy):
    model, _ = toy
    n = model.config.num_hidden_layers
    draft = layer_draft.build(model, list(range(n)), torch.arange(model.config.vocab_size))
    ids = _ids()
    torch.testing.assert_close(draft(ids), model(ids), rtol=1e-5, atol=1e-4)


def test_the_draft_shares_the_embedding_and_guesses_only_in_its_vocabulary(toy):
    model, _ = toy
    vocab = torch.tensor([2, 7, 40, 41, 300])
    draft = layer_draft.build(model, [0], vocab)
    assert draft.model.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    logits = draft(_ids())[0, -1].detach()
    q = probs_from_logits(logits, SamplingParams(temperature=1.0))
    off = torch.ones(model.config.vocab_size, dtype=torch.bool)
    off[vocab] = False
    assert torch.all(q[off] == 0) and torch.all(q[vocab] > 0) and abs(float(q.sum()) - 1) < 1e-5
    # on the vocabulary the logits are the target's own head rows times the draft's hidden state
    h = draft_train.draft_hidden(draft, _ids())[0, -1]
    torch.testing.assert_close(logits[vocab], model.lm_head.weight[vocab] @ h, rtol=1e-5, atol=1e-5)


def test_save_and_load_give_the_same_draft(toy, tmp_path):
    model, _ = toy
    draft = layer_draft.build(model, [0, 1], torch.arange(0, model.config.vocab_size, 3))
    with torch.no_grad():
        draft.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # no longer the target's layer
    folder = layer_draft.save(draft, tmp_path / "target_draft", "target", [0, 1], dtype=torch.float32)
    assert layer_draft.folder_of(folder) == folder and layer_draft.folder_of("target") is None
    back = layer_draft.load(folder, model)
    assert back.model.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = _ids(seed=3)
    torch.testing.assert_close(back(ids), draft(ids), rtol=1e-5, atol=1e-4)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model"]["hidden_size"] += 8
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InferlabError, match="train one for it"):
        layer_draft.load(folder, model)


def _run(model, tok, spec, prompts, max_tokens=24):
    engine = LLMEngine(model, tok, EngineConfig(max_num_seqs=2, speculative_config=spec))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return outs, engine.counters


def test_through_the_engine_greedy_outputs_are_plain_decoding(toy, tmp_path):
    model, tok = toy
    prompts = ["def fib(n):\n", "import os\n\n\nclass Path:\n"]
    plain, _ = _run(model, tok, None, prompts)
    n = model.config.num_hidden_layers
    whole = layer_draft.save(layer_draft.build(model, list(range(n)), torch.arange(model.config.vocab_size)),
                             tmp_path / "whole", "target", list(range(n)), dtype=torch.float32)
    out, c = _run(model, tok, {"model": str(whole), "num_speculative_tokens": 3}, prompts)
    assert out == plain
    # the draft is the target: every guess is the target's own greedy choice
    assert c["spec_decode_num_accepted_tokens"] == c["spec_decode_num_draft_tokens"] > 0
    small = layer_draft.save(layer_draft.build(model, [0], torch.arange(0, model.config.vocab_size, 2)),
                             tmp_path / "small", "target", [0], dtype=torch.float32)
    out, c = _run(model, tok, {"model": str(small), "num_speculative_tokens": 3}, prompts)
    assert out == plain and c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]


def test_under_a_quantized_target_the_draft_reads_q8_0_and_keeps_greedy_outputs(toy, tmp_path):
    """A target run from Q8_0 weights gets a draft whose layers and head rows are Q8_0 too (its
    bytes set c), and greedy outputs stay plain decoding's on that target."""
    import copy

    from inferlab.quant import GGMLLinear, quantize_model

    model, tok = toy
    q = copy.deepcopy(model)
    quantize_model(q, "q8_0", progress=False)
    prompts = ["def fib(n):\n", "import os\n\n\nclass Path:\n"]
    plain, _ = _run(q, tok, None, prompts)
    n = model.config.num_hidden_layers
    whole = layer_draft.save(layer_draft.build(model, list(range(n)), torch.arange(0, model.config.vocab_size, 2)),
                             tmp_path / "whole", "target", list(range(n)), dtype=torch.float32)
    draft = layer_draft.attach(str(whole), q)
    assert isinstance(draft.lm_head.quantized, GGMLLinear)
    out, c = _run(q, tok, {"model": str(whole), "num_speculative_tokens": 3}, prompts)
    assert out == plain and c["spec_decode_num_accepted_tokens"] > 0


def test_distillation_raises_held_out_agreement(toy, tmp_path):
    """A one-layer cut of the toy target, distilled for 40 steps on the target's own greedy
    continuations, agrees with the target more often on continuations it did not train on."""
    from inferlab.spec.eagle_train import feature_stage

    model, tok = toy
    seqs = _run(model, tok, None, [f"def f{i}(x):\n    return x + {i}\n" * 2 for i in range(12)], max_tokens=16)[0]
    samples = [{"prompt": str(i), "prompt_ids": tok.encode(f"def f{i}(x):\n    return x + {i}\n" * 2),
                "answer_ids": list(seqs[str(i)])} for i in range(12)]
    feats = feature_stage(model, tmp_path, samples, quiet=True)
    draft = layer_draft.build(model, [0], torch.arange(model.config.vocab_size))
    rows = draft.lm_head.rows
    before = draft_train.agreement(draft, samples[9:], feats[9:], model, rows)
    draft_train.train(draft, model, samples[:9], feats[:9], rows, steps=40, lr=3e-3, batch_size=3,
                      run_dir=tmp_path, seed=0, quiet=True)
    after = draft_train.agreement(draft, samples[9:], feats[9:], model, rows)
    assert after["kl"] < before["kl"] and after["greedy_agreement"] > before["greedy_agreement"]
    assert (tmp_path / "draft_ckpt.pt").exists()
    # the shared embedding was not trained
    assert torch.equal(draft.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_the_shipped_smollm2_draft_is_small_and_has_its_card():
    from inferlab.spec.medusa import beside_target

    folder = beside_target("smollm2", "draft")
    assert layer_draft.folder_of("smollm2_draft") == folder
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size <= 30e6, size  # the budget: 30 MB
    m = json.loads((folder / "metrics.json").read_text())
    after, before = m["held_out"]["after"], m["held_out"]["before"]
    assert after["greedy_agreement"] > before["greedy_agreement"] and after["kl"] < before["kl"]
    assert 0 < m["draft_cost_ratio"] < 0.5 and m["train_time_s"] > 0
    card = (folder / "README.md").read_text()
    assert f"{after['greedy_agreement']:.1%}" in card and "inferlab train draft" in card


@pytest.mark.slow
def test_the_shipped_smollm2_draft_keeps_greedy_outputs_and_guesses_right_sometimes(smollm2_fp32):
    from inferlab.bench.spec import chat_prompts

    model, tok = smollm2_fp32
    prompts = chat_prompts(tok, "grounded", 2)
    plain, _ = _run(model, tok, None, prompts, max_tokens=32)
    out, c = _run(model, tok, {"model": "smollm2_draft", "num_speculative_tokens": 3}, prompts, max_tokens=32)
    assert out == plain
    assert 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]
