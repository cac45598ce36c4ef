"""inferlab against transformers on tiny random checkpoints that transformers saved itself."""
from __future__ import annotations

import pytest
import torch

from inferlab import LLM, SamplingParams
from inferlab.attention import AttentionMetadata
from inferlab.cache import ContiguousKVCache
from inferlab.model.loader import load_checkpoint

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
    with torch.no_grad():  # both stop at EOS (min_new_tokens would mask EOS in transformers only)
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(temperature=0, max_tokens=24))
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
            meta = AttentionMetadata(positions=torch.tensor([[t]]), kv_cache=cache, cache_start=t)
            steps.append(model(ids[:, t:t + 1], meta))
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-4


@pytest.mark.parametrize("batch", [1, 3])
def test_prefill_then_chunks_equals_full_forward(pair, batch):
    """T > 1 new tokens on a non-empty cache (chunked prefill, speculative verification): the new
    queries are the last T positions, so causality aligns bottom-right."""
    _, model, _ = pair
    ids = torch.randint(0, VOCAB, (batch, 31), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids)
        for splits in ([20, 25, 31], [1, 2, 9, 31], [12, 31], [5, 6, 18, 29, 31]):
            cache = ContiguousKVCache.for_model(model.config, batch, 31, torch.float32, "cpu")
            start, parts = 0, []
            for end in splits:
                pos = torch.arange(start, end).expand(batch, -1)
                parts.append(model(ids[:, start:end], AttentionMetadata(pos, kv_cache=cache, cache_start=start)))
                start = end
            assert (torch.cat(parts, dim=1) - full).abs().max().item() <= 1e-4, splits


def test_left_padded_chunks_equal_unpadded_forward(pair):
    """A left-padded row run in chunks gives the logits of the same row run alone, unpadded."""
    _, model, _ = pair
    gen = torch.Generator().manual_seed(4)
    short, long = torch.randint(0, VOCAB, (1, 17), generator=gen), torch.randint(0, VOCAB, (1, 23), generator=gen)
    pad = long.shape[1] - short.shape[1]
    ids = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1), long])
    key_mask = torch.ones(2, 23, dtype=torch.bool)
    key_mask[0, :pad] = False
    positions = (torch.arange(23)[None] - torch.tensor([[pad], [0]])).clamp(min=0)
    with torch.no_grad():
        alone = [model(short), model(long)]
        cache = ContiguousKVCache.for_model(model.config, 2, 23, torch.float32, "cpu")
        parts = []
        for start, end in ((0, 10), (10, 11), (11, 23)):
            meta = AttentionMetadata(positions[:, start:end], kv_cache=cache, cache_start=start, key_mask=key_mask)
            parts.append(model(ids[:, start:end], meta))
        got = torch.cat(parts, dim=1)
    assert (got[0, pad:] - alone[0][0]).abs().max().item() <= 1e-4
    assert (got[1] - alone[1][0]).abs().max().item() <= 1e-4


def test_batch_of_different_lengths_equals_one_by_one(pair):
    _, _, folder = pair
    llm = LLM(str(folder), device="cpu")
    prompts = [[3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2], [11]]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    batched = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp)]
    alone = [llm.generate(prompt_token_ids=[p], sampling_params=sp)[0].outputs[0].token_ids for p in prompts]
    assert batched == alone
