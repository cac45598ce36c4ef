"""The server through the official ``openai`` client: completions, chat, streaming, models, health."""
from __future__ import annotations

import httpx
import pytest

from inferlab.llm import LLM
from inferlab.sampling import SamplingParams

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def offline():
    """The same model run offline through ``LLM.generate``: what the server must answer."""
    return LLM("draft", device="cpu")


def test_completion_matches_offline_generate(client, offline):
    r = client.completions.create(model="draft", prompt=PROMPT, max_tokens=24, temperature=0)
    want = offline.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24))[0].outputs[0]
    assert r.object == "text_completion" and r.model == "draft"
    assert r.choices[0].text == want.text
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == len(offline.encode(PROMPT))
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_completion_equals_non_streamed(client):
    kw = dict(model="draft", prompt="import os\n", max_tokens=40, temperature=0)
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(chunks) > 3  # it really streamed, token by token
    assert text == whole.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_token_id_prompt_and_echo(client, offline):
    ids = offline.encode(PROMPT)
    by_text = client.completions.create(model="draft", prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model="draft", prompt=ids, max_tokens=8, temperature=0, echo=True)
    assert by_ids.choices[0].text == PROMPT + by_text.choices[0].text


def test_n_and_a_list_of_prompts_give_one_choice_each(client):
    r = client.completions.create(model="draft", prompt=["import sys", "class A:"], n=3, max_tokens=6,
                                  temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == list(range(6))
    alone = client.completions.create(model="draft", prompt="class A:", n=3, max_tokens=6, temperature=1.0, seed=7)
    assert [c.text for c in r.choices[3:]] == [c.text for c in alone.choices]  # choice i*n+j: prompt i, sample j


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model="draft", prompt="for i in", max_tokens=12, temperature=0.9, top_p=0.9, seed=3)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_stop_string_is_cut(client):
    r = client.completions.create(model="draft", prompt=PROMPT, max_tokens=40, temperature=0, stop=["\n"])
    assert "\n" not in r.choices[0].text and r.choices[0].finish_reason == "stop"


def test_chat_default_template_continues_the_messages(client):
    """No chat template in the embedded folder: the messages' contents joined by newlines."""
    msgs = [{"role": "system", "content": "# utilities"}, {"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model="draft", messages=msgs, max_tokens=16, temperature=0)
    plain = client.completions.create(model="draft", prompt="# utilities\n" + PROMPT, max_tokens=16, temperature=0)
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage == plain.usage


def test_streamed_chat_equals_non_streamed(client):
    kw = dict(model="draft", messages=[{"role": "user", "content": [{"type": "text", "text": "import re"}]}],
              max_completion_tokens=30, temperature=0)
    whole = client.chat.completions.create(**kw).choices[0]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_chat_without_max_tokens_runs_to_the_context_end(client, offline):
    content = "x = 1\n" * 123
    room = 512 - len(offline.encode(content))  # max_model_len of the draft model
    assert 0 < room < 40
    r = client.chat.completions.create(model="draft", messages=[{"role": "user", "content": content}],
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == room and r.choices[0].finish_reason == "length"


def test_models_and_health(client, server):
    (card,) = client.models.list().data
    assert card.id == "draft" and card.owned_by == "inferlab"
    assert httpx.get(server.url + "/health").status_code == 200


def test_streamed_n_choices_equal_non_streamed(client):
    kw = dict(model="draft", prompt="def g(", n=2, max_tokens=12, temperature=0.8, seed=11)
    whole = sorted((c.index, c.text) for c in client.completions.create(**kw).choices)
    texts = {}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert sorted(texts.items()) == whole


def _fail_next_step(server):
    """Make the engine's next step raise, once (as a bug or an out-of-memory would)."""
    from serve.conftest import on_engine

    def install(engine):
        def boom():
            del engine.step  # back to the class's method
            raise RuntimeError("injected step failure")
        engine.step = boom

    on_engine(server, install)


def test_a_failing_step_fails_its_requests_and_the_server_goes_on(server, client):
    import json

    from serve.conftest import wait_idle

    _fail_next_step(server)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 4})
    assert r.status_code == 500 and r.json()["error"]["code"] == 500 and "Traceback" not in r.text
    _fail_next_step(server)
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 4, "stream": True}) as s:
        events = [x[6:] for x in s.iter_lines() if x.startswith("data: ")]
    assert events[-1] == "[DONE]" and "injected step failure" in json.loads(events[-2])["error"]["message"]
    assert wait_idle(server)["used_blocks"] == 0
    assert client.completions.create(model="draft", prompt="x", max_tokens=3).usage.completion_tokens >= 1
