"""DELTA outputs carry only what is new: the prompt's log-probs come with the first output of a
request and with none after it (CUMULATIVE repeats them, as it repeats everything)."""
from __future__ import annotations

from inferlab import LLM, SamplingParams


def outputs(engine, kind: str) -> list:
    engine.add_request("r", "def f(x):", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                         prompt_logprobs=2, output_kind=kind, n=2))
    got = []
    while engine.has_unfinished_requests():
        got += engine.step()
    return got


def test_delta_sends_prompt_logprobs_once():
    engine = LLM(model="draft", device="cpu").llm_engine
    delta = outputs(engine, "delta")
    assert len(delta) > 2
    first = delta[0].prompt_logprobs
    assert first is not None and first[0] is None and len(first) == len(delta[0].prompt_token_ids)
    assert all(o.prompt_logprobs is None for o in delta[1:])
    cumulative = outputs(engine, "cumulative")
    assert all(o.prompt_logprobs == first for o in cumulative)
