"""EOS through the server, on a model that really emits it: the embedded target was trained on
whole files, each ending in EOS, and ends ``if __name__ == "__main__":\n    main(`` after about
ten tokens. (The draft's tiny vocabulary of habits never gets there: it always runs to length.)"""
from __future__ import annotations

import openai
import pytest

from inferlab.llm import LLM
from inferlab.sampling import SamplingParams
from inferlab.serve.launcher import ServerThread, make_app

PROMPT = 'if __name__ == "__main__":\n    main('


@pytest.fixture(scope="module")
def target():
    with ServerThread(make_app("target", device="cpu", max_num_seqs=4, num_kv_blocks=64)) as s:
        yield s, openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def offline():
    llm = LLM("target", device="cpu")
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40))[0].outputs[0]
    out.eos_token_ids = llm.llm_engine.eos_token_ids
    return out


def test_the_target_ends_this_prompt_with_eos(offline):
    assert offline.finish_reason == "stop" and offline.token_ids[-1] in offline.eos_token_ids
    assert 3 <= len(offline.token_ids) < 40


def test_eos_stops_a_completion_streamed_or_not(target, offline):
    _, client = target
    kw = dict(model="target", prompt=PROMPT, max_tokens=40, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.choices[0].finish_reason == "stop" == [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    assert whole.choices[0].text == streamed == offline.text  # the EOS token leaves no text
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens == len(offline.token_ids)


def test_ignore_eos_runs_past_it(target, offline):
    _, client = target
    r = client.completions.create(model="target", prompt=PROMPT, max_tokens=40, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40
    assert r.choices[0].text.startswith(offline.text)


def test_eos_stops_a_chat_reply(target, offline):
    _, client = target
    r = client.chat.completions.create(model="target", messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == offline.text
