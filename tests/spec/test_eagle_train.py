"""``inferlab train eagle``'s pieces: the inputs line up as the engine feeds them (x_t beside
f_(t-1), labels x_(t+1) on answer positions only), the draft vocabulary keeps the most frequent
answer tokens and the end of turn, the prompts never include the benchmark's held-out ones, and
the shipped smollm2 draft loads with its card."""
from __future__ import annotations

import json
import types

import pytest
import torch

from inferlab.errors import InferlabError
from inferlab.spec import eagle_train


def _fake_target(vocab=10, hidden=4):
    emb = torch.nn.Embedding(vocab, hidden)
    return types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden, vocab_size=vocab),
                                 model=types.SimpleNamespace(embed_tokens=emb))


def test_batch_pairs_each_token_with_the_feature_before_it():
    target = _fake_target()
    samples = [{"prompt_ids": [1, 2], "answer_ids": [3, 4, 5]}, {"prompt_ids": [6], "answer_ids": [7]}]
    feats = [torch.arange(5 * 4, dtype=torch.float16).view(5, 4), torch.full((2, 4), 9.0, dtype=torch.float16)]
    t2d = torch.full((10,), -100)
    t2d[[3, 4, 5, 7]] = torch.tensor([0, 1, 2, 3])
    embeds, prev, cur, labels = eagle_train._batch(target, samples, feats, [0, 1], t2d)
    assert embeds.shape == (2, 5, 4) and torch.equal(embeds[0, 2], target.model.embed_tokens.weight[3].detach())
    assert torch.equal(prev[0, 0], torch.zeros(4)) and torch.equal(prev[0, 3], feats[0][2].float())
    assert torch.equal(cur[0, 3], feats[0][3].float())
    # position t is labelled with x_(t+1) from the last prompt token to the one before the answer's end
    assert labels[0].tolist() == [-100, 0, 1, 2, -100]
    assert labels[1].tolist() == [3, -100, -100, -100, -100]  # padding is never labelled


def test_draft_vocabulary_keeps_the_frequent_tokens_and_the_end_of_turn():
    samples = [{"answer_ids": [5, 5, 5, 7, 7, 9]}, {"answer_ids": [5, 7, 3]}]
    d2t = eagle_train.draft_vocabulary(samples, 3, always=(2,))
    assert d2t.tolist() == [2, 5, 7]  # sorted by id; 2 kept though never in an answer


def test_training_prompts_leave_the_benchmark_out():
    from inferlab.bench.spec import PROMPT_SETS

    held = json.loads(PROMPT_SETS.read_text())
    prompts = eagle_train.training_prompts(300, 0)
    assert len(set(prompts)) == len(prompts)  # no prompt twice: the held-out share must be unseen
    assert not set(prompts) & set(held["grounded"] + held["free"])
    assert eagle_train.training_prompts(50, 0) == prompts[:50]  # a rerun with fewer resumes the same list


def test_the_shipped_smollm2_draft_loads_with_its_card(smollm2_fp32):
    from inferlab.spec.eagle import eagle_folder_for, load_eagle

    model, _ = smollm2_fp32
    folder = eagle_folder_for("smollm2")
    draft = load_eagle(folder, model.config)
    card = json.loads((folder / "metrics.json").read_text())
    assert draft.draft_vocab_size == card["draft_vocab_size"] and draft.d2t.max() < model.config.vocab_size
    assert (folder / "model.safetensors").stat().st_size < 30e6  # the size the course allows
    assert card["held_out"]["top1_step1"] > 0.3 and 0 < card["draft_cost_ratio"] < 0.2
    assert "Held out" in (folder / "README.md").read_text()


def test_prompt_stage_interleaves_the_targets_requests_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(eagle_train, "magpie_prompts", lambda llm, n, seed, quiet=False: [f"own {i}" for i in range(n)])
    prompts = eagle_train.prompt_stage(None, tmp_path, 40, 0, magpie=0.25)
    own = [i for i, p in enumerate(prompts) if p.startswith("own ")]
    assert len(prompts) == 40 and len(own) == 10 and own[-1] >= 36  # spread through, the held-out tail included
    assert prompts[own[0]] == "own 0" and prompts[own[-1]] == "own 9"
    assert eagle_train.prompt_stage(None, tmp_path, 40, 1, magpie=0.9) == prompts  # a rerun reads the file
    with pytest.raises(InferlabError, match="--prompts 40"):
        eagle_train.prompt_stage(None, tmp_path, 50, 0, magpie=0.25)


def test_magpie_needs_a_chat_template():
    from inferlab.llm import load_model

    llm = types.SimpleNamespace(tokenizer=load_model("target")[1])
    with pytest.raises(InferlabError, match="--magpie 0"):
        eagle_train.magpie_prompts(llm, 4, 0)


def test_smollm2_writes_its_own_requests_seeded_and_never_the_benchmarks():
    from inferlab.bench.spec import PROMPT_SETS
    from inferlab.llm import LLM

    llm = LLM("smollm2", max_num_seqs=64)
    first = eagle_train.magpie_prompts(llm, 12, seed=3, quiet=True)
    assert eagle_train.magpie_prompts(llm, 12, seed=3, quiet=True) == first  # seeded: a rerun writes the same
    assert len(set(first)) == 12 and all(len(p) >= 20 and "<|im_" not in p for p in first)
    held = json.loads(PROMPT_SETS.read_text())
    assert not set(first) & set(held["grounded"] + held["free"])
    assert eagle_train.magpie_prompts(llm, 12, seed=4, quiet=True) != first
