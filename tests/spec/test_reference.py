"""The contiguous speculative loop: greedy outputs equal plain decoding token for token, stops land
where plain decoding puts them, and seeded sampling is reproducible."""
from __future__ import annotations

import pytest

from inferlab.generate import generate
from inferlab.model.loader import load_checkpoint
from inferlab.sampling import SamplingParams
from inferlab.spec import NgramProposer
from inferlab.spec.reference import DraftModelProposer, speculative_generate

PROMPTS = ["def fib(n):\n", "import os\n\n\nclass Path:\n    def __init__(self, path):\n        self.path = path\n\n    def",
           "for i in range(10):\n    print(i"]


@pytest.fixture(scope="module")
def pair():
    target, tok = load_checkpoint("target", device="cpu")
    draft, _ = load_checkpoint("draft", device="cpu")
    return target, draft, tok


def proposers(draft):
    return [NgramProposer(3, 1, 3), NgramProposer(5, 2, 4), DraftModelProposer(draft, 1), DraftModelProposer(draft, 4)]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_plain_decoding(pair, prompt):
    target, draft, tok = pair
    ids = tok.encode(prompt)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = generate(target, [ids], [params])[0].output_token_ids
    for prop in proposers(draft):
        seq, stats = speculative_generate(target, ids, params, prop)
        assert seq.output_token_ids == want, prop
        assert stats.emitted == 39 and stats.steps <= 39  # the first token comes from the prefill


def test_stops_where_plain_decoding_stops(pair):
    target, draft, tok = pair
    ids = tok.encode(PROMPTS[1])
    plain = generate(target, [ids], [SamplingParams(temperature=0, max_tokens=60)],
                     eos_token_ids=target.config.eos_token_ids, tokenizer=tok)[0]
    stop_at = plain.output_token_ids[7]  # a token id the plain run emits: stop there
    params = SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[stop_at])
    want = generate(target, [ids], [params], eos_token_ids=target.config.eos_token_ids, tokenizer=tok)[0]
    for prop in proposers(draft):
        seq, _ = speculative_generate(target, ids, params, prop, target.config.eos_token_ids, tok)
        assert seq.output_token_ids == want.output_token_ids
        assert seq.finish_reason == want.finish_reason == "stop"


def test_seeded_sampling_is_reproducible(pair):
    target, draft, tok = pair
    ids = tok.encode(PROMPTS[0])
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, seed=5, ignore_eos=True)
    runs = [speculative_generate(target, ids, params, DraftModelProposer(draft, 3))[0].output_token_ids
            for _ in range(2)]
    other = speculative_generate(target, ids, SamplingParams(**{**params.__dict__, "seed": 6}),
                                 DraftModelProposer(draft, 3))[0].output_token_ids
    assert runs[0] == runs[1] and runs[0] != other


class CheckedDraft(DraftModelProposer):
    """Each proposal must equal a fresh draft's on the committed tokens: after a rejection the
    draft's cache is rolled back, never left holding the rejected guesses."""

    def propose(self, tokens, params, gen):
        fresh = DraftModelProposer(self.model, self.k)
        fresh.start(len(tokens) + self.k + 1)
        want, _ = fresh.propose(tokens, params, None)
        got, q = super().propose(tokens, params, gen)
        assert got == want
        return got, q


def test_draft_cache_rolls_back_after_a_rejection(pair):
    target, draft, tok = pair
    ids = tok.encode(PROMPTS[1])
    seq, stats = speculative_generate(target, ids, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                                      CheckedDraft(draft, 3))
    assert 0 < stats.accepted < stats.proposed  # both accepted and rejected guesses happened
