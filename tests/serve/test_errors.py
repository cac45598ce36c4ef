"""Refused requests: OpenAI's error JSON with status 400 (404 for an unknown model or route, 405 for
a wrong method), never a trace;
the official client raises its own exception types for them."""
from __future__ import annotations

import httpx
import openai
import pytest


def _post(server, path, **kw):
    r = httpx.post(server.url + path, **kw)
    assert "Traceback" not in r.text
    return r


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"prompt": 3}', "prompt"),
    (b'{"max_tokens": 4}', "prompt"),
    (b'{"prompt": "x", "max_tokens": "many"}', "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 600}', "max_tokens"),
    (b'{"prompt": "x", "temperature": -1}', None),
    (b'{"prompt": "x", "n": 0}', None),
    (b'{"prompt": "x", "n": 9}', None),                 # more than max_num_seqs
    (b'{"prompt": "x", "n": 2, "best_of": 3}', None),
    (b'{"prompt": "x", "logprobs": 21}', "logprobs"),        # above the cap (max_logprobs, 20)
    (b'{"prompt": "x", "logprobs": -1}', "logprobs"),
    (b'{"prompt": ""}', "prompt"),
    (b'{"prompt": [1, 99999]}', "prompt"),
    (b'{"prompt": []}', "prompt"),
    (b'{"prompt": "x", "temperature": NaN}', "temperature"),   # would poison a whole engine step
    (b'{"prompt": "x", "top_p": Infinity}', "top_p"),
    (b'{"prompt": "x", "seed": 1180591620717411303424}', "seed"),
    (b'{"prompt": "x", "stop": ["\\n", ""]}', "stop"),
])
def test_bad_completion_requests_get_400(server, body, param):
    r = _post(server, "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert err["message"] and "\n" not in err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
    {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1},
    {"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5},
    {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},                    # without logprobs
    {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},  # above the cap
])
def test_bad_chat_requests_get_400(server, body):
    r = _post(server, "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400


def test_prompt_longer_than_the_context(client):
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="draft", prompt="x = 1\n" * 200, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model="draft", messages=[{"role": "user", "content": "x = 1\n" * 200}])


def test_unknown_model_is_404_as_in_openai_and_vllm(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-5", prompt="x", max_tokens=2)


def test_a_refused_request_leaves_nothing_behind(server, client):
    """A request's prompts are queued all together or not at all: when the engine refuses the
    second, the first (100 tokens to go) is taken back before the answer leaves."""
    from serve.conftest import on_engine

    calls = []

    def refuse_the_second(engine):
        real = engine.add_request

        def add_request(*a, **kw):
            calls.append(a[0])
            if len(calls) == 2:
                raise ValueError("the engine refuses this prompt")
            return real(*a, **kw)
        engine.add_request = add_request

    on_engine(server, refuse_the_second)
    try:
        with pytest.raises(openai.BadRequestError, match="refuses this prompt"):
            client.completions.create(model="draft", prompt=["def f():", "x = 1"], max_tokens=100,
                                      extra_body={"ignore_eos": True})
    finally:
        on_engine(server, lambda e: e.__dict__.pop("add_request"))
    assert len(calls) == 2
    stats = on_engine(server, lambda e: {**e.kv_cache_stats(), "requests": len(e.requests)})
    assert stats["requests"] == 0 and stats["used_blocks"] == 0 and stats["num_waiting"] == 0
    with pytest.raises(openai.BadRequestError, match="context"):  # refused before the engine sees it
        client.completions.create(model="draft", prompt=["def f():", "x = 1\n" * 123], max_tokens=100)


def test_unknown_route_and_method(server):
    for r, status in ((httpx.get(server.url + "/v1/completions"), 405), (httpx.get(server.url + "/v2/nothing"), 404)):
        assert r.status_code == status and r.json()["error"]["code"] == status
