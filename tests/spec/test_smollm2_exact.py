"""Speculative sampling stays exact on the real target: smollm2 in fp32, sampled through the engine
with prompt lookup, the shipped EAGLE draft and the draft cut from smollm2, follows the target's own distribution over
the first three tokens (a chi-square test against the joint enumerated from the target, as
tests/engine/test_spec_distribution.py does on the toy; a reduced budget: 600 requests, decoded side by side).

One request runs first and the KV blocks hold 4 tokens: every request after it finds all but its
last few prompt tokens in the prefix cache, so the 600 compute a few prompt tokens each, not their
whole prompts (which took most of each test's minute)."""
from __future__ import annotations

import collections

import pytest

from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.sampling import SamplingParams
from inferlab.spec.eagle import eagle_folder_for

from engine.test_spec_distribution import assert_chi_square, exact_joint

PROMPT = "Count with me: one, two, three, four, five. One, two, three, four, five. One, two, three,"


T1 = SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True)
T07_P09 = SamplingParams(temperature=0.7, top_p=0.9, top_k=4, max_tokens=3, ignore_eos=True)


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [("ngram", T1), ("ngram", T07_P09), ("eagle", T1), ("eagle", T07_P09),
                                           ("draft", T07_P09)],
                         ids=["ngram-t1", "ngram-t0.7-p0.9", "eagle-t1", "eagle-t0.7-p0.9", "draft-t0.7-p0.9"])
def test_sampled_outputs_follow_the_real_target(smollm2_fp32, params, method):
    """(The draft cut from smollm2 has q = 0 off its draft vocabulary: the residual must supply
    those tokens, and top-p's nucleus must be the target's, not the draft's.)"""
    model, tok = smollm2_fp32
    spec = {"ngram": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            "eagle": {"method": "eagle", "num_speculative_tokens": 2, "model": str(eagle_folder_for("smollm2"))},
            "draft": {"model": "smollm2_draft", "num_speculative_tokens": 2}}[method]
    prompt, n = tok.encode(PROMPT), 600
    if method == "draft":  # the draft learnt from smollm2's chat answers only: ask it as a chat
        from inferlab.model.chat import Chat
        prompt = Chat(tok).prompt([{"role": "user", "content": PROMPT}])[1]
    engine = LLMEngine(model, tok, EngineConfig(max_num_seqs=n, enable_prefix_caching=True, block_size=4,
                                                speculative_config=spec))
    engine.add_request("warm-up", prompt, SamplingParams(temperature=0, max_tokens=1))  # fills the prefix cache
    while engine.has_unfinished_requests():
        engine.step()
    for i in range(n):
        engine.add_request(str(i), prompt, SamplingParams(**{**params.__dict__, "seed": i}))
    finals = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
    counts = collections.Counter(tuple(o.outputs[0].token_ids[:3]) for o in finals.values())
    c = engine.counters
    assert c["num_prompt_tokens"] <= len(prompt) + n * engine.config.block_size, \
        "the prompts after the first come from the prefix cache"
    assert 0 < c["spec_decode_num_accepted_tokens"] < c["spec_decode_num_draft_tokens"]
    exp = exact_joint(model, prompt, params)
    assert set(counts) <= set(exp) and abs(sum(exp.values()) - 1) < 1e-4
    assert_chi_square(counts, exp, n)


@pytest.mark.slow
def test_shipped_medusa_heads_keep_greedy_outputs_and_guess_right_sometimes(smollm2_fp32):
    """smollm2's Medusa heads (trained on its own answers) through the engine: the greedy outputs
    of two held-out chat prompts are plain decoding's, and some guesses are kept."""
    from inferlab.bench.spec import chat_prompts
    from inferlab.spec.medusa import heads_folder_for

    from spec.test_layer_draft import _run

    model, tok = smollm2_fp32
    prompts = chat_prompts(tok, "grounded", 2)
    plain, _ = _run(model, tok, None, prompts, max_tokens=32)
    spec, c = _run(model, tok, {"method": "medusa", "num_speculative_tokens": 3,
                                "model": str(heads_folder_for("smollm2"))}, prompts, max_tokens=32)
    assert spec == plain
    assert c["spec_decode_num_accepted_tokens"] > 0
