"""inferlab against transformers on tiny random checkpoints that transformers saved itself."""
from __future__ import annotations

import pytest
import torch

from inferlab import LLM, SamplingParams
from inferlab.attention import AttentionMetadata
from inferlab.cache import ContiguousKVCache
from inferlab.loader import load_checkpoint

from .checkpoints import VARIANTS, VOCAB, save_variant

CASES = [(name, classic) for name in VARIANTS for classic in (False, True)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{'classic' if c else 'rope_parameters'}" for n, c in CASES])
def pair(request, tmp_path_factory):
    name, classic = request.param
    folder = tmp_path_factory.mktemp(name)
    hf = save_variant(name, folder, classic=classic)
    ours, _ = load_checkpoint(folder, device="cpu")
    return hf, ours, folder


def test_logits_match_transformers(pair):
    hf, ours, _ = pair
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert got.shape == expected.shape == (2, 40, VOCAB)
    assert (got - expected).abs().max().item() <= 1e-4


def test_greedy_tokens_match_transformers(pair):
    hf, _, folder = pair
    llm = LLM(str(folder), device="cpu")
    prompt = [5, 17, 99, 42, 7]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
    out = llm.generate(prompt_token_ids=[prompt],
                       sampling_params=SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert out[0].outputs[0].token_ids == ref[0, len(prompt):].tolist()


def test_kv_cache_path_equals_no_cache_path(pair):
    _, model, _ = pair
    ids = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(ids)
        cache = ContiguousKVCache.for_model(model.config, 1, 30, torch.float32, "cpu")
        first = model(ids[:, :20], AttentionMetadata(positions=torch.arange(20)[None], kv_cache=cache))
        steps = [first]
        for t in range(20, 30):
            meta = AttentionMetadata(positions=torch.tensor([[t]]), kv_cache=cache, cache_start=t, is_causal=False)
            steps.append(model(ids[:, t:t + 1], meta))
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-4


def test_batch_of_different_lengths_equals_one_by_one(pair):
    _, _, folder = pair
    llm = LLM(str(folder), device="cpu")
    prompts = [[3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2], [11]]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    batched = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp)]
    alone = [llm.generate(prompt_token_ids=[p], sampling_params=sp)[0].outputs[0].token_ids for p in prompts]
    assert batched == alone
