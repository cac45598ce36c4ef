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


def _stream_texts(chunks) -> tuple[dict, dict]:
    """choice index -> streamed text, and -> the finish reasons it was sent (one expected)."""
    texts, reasons = {}, {}
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                reasons.setdefault(c.index, []).append(c.finish_reason)
    return texts, reasons


def test_streamed_choices_of_several_prompts_times_n_are_indexed_i_times_n_plus_j(client):
    """Three prompts, n = 3: choice i * n + j is completion j of prompt i, streamed or not."""
    kw = dict(model="draft", prompt=["import sys", "class A:", "def g("], n=3, max_tokens=8, temperature=0.8,
              seed=5)
    whole = {c.index: (c.text, c.finish_reason) for c in client.completions.create(**kw).choices}
    texts, reasons = _stream_texts(client.completions.create(**kw, stream=True))
    assert sorted(texts) == sorted(whole) == list(range(9))
    assert {i: (texts[i], reasons[i][0]) for i in texts} == whole
    assert all(len(r) == 1 for r in reasons.values())  # each choice finishes once
    for i, prompt in enumerate(kw["prompt"]):  # prompt i alone gives choices i*n .. i*n + n-1
        alone = client.completions.create(**{**kw, "prompt": prompt}).choices
        assert [c.text for c in alone] == [whole[i * 3 + j][0] for j in range(3)]


def _stop_inside_a_token(offline, prompt: str, max_tokens: int) -> tuple[str, str]:
    """The greedy text of ``prompt`` and a 6-character stop string that starts in the middle of one
    token and ends in a later one, at its first occurrence: the stream must hold back the
    partial match it sees first and never send it."""
    ids = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens,
                                                    ignore_eos=True))[0].outputs[0].token_ids
    text = offline.tokenizer.decode(ids)
    ends = sorted({len(offline.tokenizer.decode(ids[:k])) for k in range(1, len(ids))})
    for end in ends:
        stop = text[end - 2:end + 4]
        if end > 10 and len(stop) == 6 and text.find(stop) == end - 2 and end - 2 not in ends \
                and "\ufffd" not in stop:
            return text, stop
    raise AssertionError("no stop string that spans tokens: pick another prompt")


def test_streaming_with_a_stop_string_sends_nothing_past_it(client, offline):
    text, stop = _stop_inside_a_token(offline, PROMPT, 60)
    kw = dict(model="draft", prompt=PROMPT, max_tokens=60, temperature=0, stop=["@@never@@", stop],
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(**kw, stream=True))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.text == streamed == text[:text.find(stop)]
    assert whole.finish_reason == chunks[-1].choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model="draft", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=60, temperature=0, stop=stop, stream=True,
                                          extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in chat) == streamed


def test_streaming_n_with_a_stop_string_equals_non_streamed(client):
    kw = dict(model="draft", prompt=["def g(", "import"], n=2, max_tokens=30, temperature=0.9, seed=2,
              stop=["\n"])
    whole = {c.index: (c.text, c.finish_reason) for c in client.completions.create(**kw).choices}
    texts, reasons = _stream_texts(client.completions.create(**kw, stream=True))
    assert {i: (texts[i], reasons[i][0]) for i in texts} == whole
    assert any(reason == "stop" for _, reason in whole.values())


def test_seeded_sampling_is_reproducible_under_concurrent_load(server):
    """The same seed gives the same text while other requests share its batches: each request
    samples from its own generator, whatever else the step holds."""
    import asyncio

    from openai import AsyncOpenAI

    from serve.conftest import wait_idle

    seeded = dict(model="draft", prompt="for i in", max_tokens=24, temperature=1.0, seed=1234)
    aclient = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)

    async def run():
        alone = (await aclient.completions.create(**seeded)).choices[0].text
        others = [aclient.completions.create(model="draft", prompt=f"x{i} = ", max_tokens=20 + 3 * i,
                                             temperature=1.0, **({"seed": i} if i % 2 else {}))
                  for i in range(6)]
        mixed = await asyncio.gather(*others[:3], *[aclient.completions.create(**seeded) for _ in range(3)],
                                     *others[3:], aclient.completions.create(**{**seeded, "n": 2}))
        return alone, [m.choices[0].text for m in mixed[3:6]], mixed[-1]

    wait_idle(server)
    batch_sizes = []
    from serve.conftest import on_engine

    hook = lambda _, rec: batch_sizes.append(len(rec["scheduled"]))  # noqa: E731
    on_engine(server, lambda e: e.step_hooks.append(hook))
    try:
        alone, under_load, with_n = asyncio.run(run())
    finally:
        on_engine(server, lambda e: e.step_hooks.remove(hook))
    assert max(batch_sizes) >= 4  # the seeded requests really shared steps with others
    assert under_load == [alone] * 3
    assert with_n.choices[0].text == alone  # child 0 of n keeps the seed; child 1 uses seed + 1
    assert with_n.choices[1].text != alone
