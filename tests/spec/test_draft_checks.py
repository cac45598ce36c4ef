"""The draft method's edges: a draft whose tokenizer differs from the target's (same size) is
refused; parallel sampling (n > 1) works with a draft; and the engine's verifier really uses the
draft's q (a verifier that treated a draft's guesses as deterministic would accept far less)."""
from __future__ import annotations

import json
import shutil
import types

import pytest
import torch

from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.spec_decode import verify
from inferlab.model.loader import ASSETS, load_checkpoint
from inferlab.sampling import SamplingParams, make_generator


@pytest.fixture(scope="module")
def target():
    return load_checkpoint("target", device="cpu")


def test_a_draft_with_the_same_vocabulary_size_but_another_tokenizer_is_refused(target, tmp_path):
    """Two ids swapped: the size is the same, the tokens are not, and the guesses would be other text."""
    folder = tmp_path / "draft_swapped"
    shutil.copytree(ASSETS / "draft", folder)
    tj = json.loads((folder / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = "def", "class"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    model, tok = target
    with pytest.raises(ValueError, match="the draft's tokenizer differs from the target's [(]2 tokens differ, e.g. 'def'") as e:
        LLMEngine(model, tok, EngineConfig(speculative_config={"model": str(folder), "num_speculative_tokens": 2}))
    assert "\n" not in str(e.value)
    LLMEngine(model, tok, EngineConfig(speculative_config={"model": "draft", "num_speculative_tokens": 2}))  # same: fine


def test_parallel_samples_with_a_draft(target):
    """n = 3 siblings, each drawing inside the target's top 3 at every position, reproducibly."""
    model, tok = target
    prompt = "import os\n\n\nclass Path:\n    def"
    params = SamplingParams(temperature=1.0, top_k=3, n=3, max_tokens=24, seed=3, ignore_eos=True)

    def once():
        engine = LLMEngine(model, tok, EngineConfig(speculative_config={"model": "draft", "num_speculative_tokens": 3}))
        engine.add_request("r", prompt, params)
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                final = out
        return final, engine

    final, engine = once()
    again, _ = once()
    outs = [c.token_ids for c in final.outputs]
    assert [len(o) for o in outs] == [24, 24, 24] and len({tuple(o) for o in outs}) == 3
    assert outs == [c.token_ids for c in again.outputs]
    assert engine.counters["spec_decode_num_accepted_tokens"] > 0
    ids = tok.encode(prompt)
    for out in outs:
        with torch.inference_mode():
            top = model(torch.tensor([ids + out]))[0, len(ids) - 1:-1].topk(3, -1).indices.tolist()
        assert all(t in row for t, row in zip(out, top))


def test_the_engine_verifier_uses_the_drafts_q():
    """A toy step of 3000 sequences, one guess each drawn from q: the acceptance rate is
    sum_x min(p, q)(x) = 0.6 (Leviathan's alpha), and the first token follows p. Dropping q (the
    deterministic-draft rule) would accept sum_x p(x) q(x) = 0.2 of them."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    b = 3000
    g = torch.Generator().manual_seed(0)
    guesses = torch.multinomial(q.expand(b, 4), 1, generator=g)[:, 0].tolist()
    params = SamplingParams(temperature=1.0, seed=1)
    scheduled = [types.SimpleNamespace(spec_token_ids=[x], seq=types.SimpleNamespace(
        params=params, generator=make_generator(i, "cpu"))) for i, x in enumerate(guesses)]
    out = types.SimpleNamespace(scheduled=scheduled)
    logits = p.log().expand(2 * b, 4).clone()  # each sequence's k + 1 = 2 rows
    counters = dict.fromkeys(("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                              "spec_decode_num_accepted_tokens"), 0)
    emitted = verify(out, list(range(b)), logits, list(range(0, 2 * b + 1, 2)), {j: q[None] for j in range(b)},
                     counters)
    rate = counters["spec_decode_num_accepted_tokens"] / counters["spec_decode_num_draft_tokens"]
    assert abs(rate - 0.6) < 0.04, rate  # 4.5 sigma
    first = torch.bincount(torch.tensor([emitted[j][0] for j in range(b)]), minlength=4) / b
    assert (first - p).abs().max() < 0.04, first
