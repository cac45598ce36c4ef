"""The server holds under abuse: every cap answers an OpenAI-shaped error that the official client
raises as its typed exception, the API key guards /v1 and not the probes, and the event loop
never waits on a tokenizer or a slow reader."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

from inferlab.outputs import CompletionOutput, RequestOutput
from inferlab.serve.streams import RequestStream
from inferlab.serve.launcher import ServerThread, make_app
from inferlab.serve.limits import ServerLimits
from serve.conftest import on_engine, wait_idle

KEY = "sk-inferlab-test"
LIMITS = ServerLimits(max_body_bytes=32 << 10, max_prompts=3, max_stop=2, max_stop_chars=8, max_messages=3,
                      max_waiting_requests=8, api_key=KEY)


@pytest.fixture(scope="module")
def guarded():
    with ServerThread(make_app("draft", device="cpu", max_num_seqs=4, num_kv_blocks=64, limits=LIMITS)) as s:
        yield s


@pytest.fixture()
def client(guarded):
    return openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)


def _complete(client, **kw):
    return client.completions.create(**{"model": "draft", "prompt": "def f(x):", "max_tokens": 2, **kw})


def _chat(client, n_messages):
    return client.chat.completions.create(model="draft", max_tokens=2,
                                          messages=[{"role": "user", "content": "x = 1"}] * n_messages)


@pytest.mark.parametrize("call,param,flag", [
    (lambda c: _complete(c, prompt=["a = 1", "b = 2", "c = 3", "d = 4"]), "prompt", "--max-prompts"),
    (lambda c: _complete(c, stop=["a", "b", "c"]), "stop", "--max-stop"),
    (lambda c: _complete(c, stop=["123456789"]), "stop", "--max-stop-chars"),
    (lambda c: _complete(c, extra_body={"stop_token_ids": [1, 2, 3]}), "stop_token_ids", "--max-stop"),
    (lambda c: _chat(c, 4), "messages", "--max-messages"),
    (lambda c: _complete(c, prompt="x" * (40 << 10)), None, "--max-body-bytes"),
])
def test_each_cap_is_a_typed_400_that_names_its_flag(client, call, param, flag):
    with pytest.raises(openai.BadRequestError) as err:
        call(client)
    e = err.value
    assert e.status_code == 400 and e.type == "BadRequestError" and e.param == param
    assert flag in e.message and "\n" not in e.message


def test_requests_at_each_cap_are_served(client):
    """The caps are limits, not off by one: exactly at each one the request runs."""
    r = _complete(client, prompt=["a = 1", "b = 2", "c = 3"], stop=["12345678", "\n\n"],
                  extra_body={"stop_token_ids": [1, 2]})
    assert len(r.choices) == 3
    assert _chat(client, 3).usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError, match="context"):  # past the body cap, refused for its length
        _complete(client, prompt="x" * (30 << 10), max_tokens=1)


def test_a_chunked_body_over_the_cap_is_refused_without_a_content_length(guarded):
    sent = []

    def body():  # no Content-Length: httpx sends it chunked
        for _ in range(64):
            sent.append(1)
            yield b'{"prompt": "' + b"x" * 1024
        yield b'"}'

    r = httpx.post(guarded.url + "/v1/completions", content=body(), timeout=30,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 400 and "--max-body-bytes" in r.json()["error"]["message"]


def test_api_key_guards_v1_but_not_health_and_metrics(guarded):
    for key in ("wrong", KEY + "x"):
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=guarded.url + "/v1", api_key=key, max_retries=0).models.list()
        assert err.value.status_code == 401 and "not valid" in err.value.message
    bare = httpx.post(guarded.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "AuthenticationError"
    assert "no API key" in bare.json()["error"]["message"]
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert httpx.get(guarded.url + "/metrics").status_code == 200
    for path in ("/v1", "/v1/", "/v1/no-such-route"):  # the whole API prefix, guarded before routing
        assert httpx.get(guarded.url + path).status_code == 401
    assert httpx.get(guarded.url + "/v2/nothing").status_code == 404  # outside the API: open, as vLLM
    ok = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0).models.list()
    assert ok.data[0].id == "draft"


def test_unknown_routes_and_wrong_methods_get_openai_json(guarded, client):
    with pytest.raises(openai.NotFoundError) as err:  # GET /v1/models/draft: a route this server lacks
        client.models.retrieve("draft")
    assert err.value.type == "NotFoundError" and "/v1/models/draft" in err.value.message
    auth = {"authorization": f"Bearer {KEY}"}
    r = httpx.get(guarded.url + "/v1/completions", headers=auth)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"] == {"message": "/v1/completions does not take GET: use POST",
                                 "type": "MethodNotAllowedError", "param": None, "code": 405}
    r = httpx.delete(guarded.url + "/v2/nothing", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_tokenizing_and_templating_run_off_the_event_loop(guarded, client, monkeypatch):
    """A slow tokenizer (a 2 s prompt) and a slow chat template run on the tokenizer thread:
    /health answers meanwhile, well before they end."""
    serving = guarded.app.state.serving
    threads = []

    class Slow:
        def __init__(self, inner):
            self.inner = inner

        def encode(self, *a, **kw):
            threads.append(threading.current_thread().name)
            time.sleep(2.0)
            return self.inner.encode(*a, **kw)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    render = serving.chat_template.render

    def slow_render(*args, **kwargs):
        threads.append(threading.current_thread().name)
        time.sleep(2.0)
        return render(*args, **kwargs)

    monkeypatch.setattr(serving, "tokenizer", Slow(serving.tokenizer))
    monkeypatch.setattr(serving.chat_template, "render", slow_render)
    for call in (lambda: _complete(client), lambda: _chat(client, 1)):
        worker = threading.Thread(target=call)
        worker.start()
        time.sleep(0.3)  # the request is inside the slow part now
        t0 = time.monotonic()
        assert httpx.get(guarded.url + "/health", timeout=5).status_code == 200
        waited = time.monotonic() - t0
        worker.join(30)
        assert waited < 1.0, f"/health waited {waited:.2f} s behind a tokenizer"
    assert threads and all(name.startswith("inferlab-tokenize") for name in threads), threads


def test_non_streaming_requests_are_final_only(guarded, client):
    """Non-streaming requests reach the engine with stream=False: no per-step outputs to copy."""
    seen = []

    def spy(engine):
        real = engine.add_request

        def add_request(*a, stream=True, **kw):
            seen.append(stream)
            return real(*a, stream=stream, **kw)
        engine.add_request = add_request

    on_engine(guarded, spy)
    try:
        _complete(client, prompt=["a = 1", "b = 2"], max_tokens=4)
        list(_complete(client, max_tokens=4, stream=True))
        _chat(client, 1)
    finally:
        on_engine(guarded, lambda e: e.__dict__.pop("add_request"))
    assert seen == [False, False, True, False]
    assert wait_idle(guarded)["used_blocks"] == 0


def _output(i: int, finished: bool = False) -> RequestOutput:
    text = "".join(f"t{k}" for k in range(i + 1))
    comps = [CompletionOutput(j, text, list(range(i + 1)), "length" if finished else None, f"t{i}", [i])
             for j in range(2)]
    return RequestOutput("r", None, [1], comps, finished)


def test_a_request_stream_holds_one_output_however_far_behind_its_reader():
    """50 steps arrive from the engine thread before the reader looks: it finds one output carrying
    every delta, in order, and the event loop was asked to wake it once, not 50 times."""
    class Owner:
        def abort(self, request_id):
            pass

    async def run():
        loop = asyncio.get_running_loop()
        stream = RequestStream(Owner(), "r", loop)
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakeups.append(a), real(*a))[1]
        engine = threading.Thread(target=lambda: [stream.put(_output(i, finished=i == 49)) for i in range(50)])
        engine.start()
        engine.join()
        del loop.call_soon_threadsafe
        assert isinstance(stream.pending, RequestOutput) and len(wakeups) == 1  # one slot, one wake-up
        return [out async for out in stream]

    (out,) = asyncio.run(run())
    want = "".join(f"t{k}" for k in range(50))
    assert out.finished and [c.delta_text for c in out.outputs] == [want, want]
    assert out.outputs[0].delta_token_ids == list(range(50)) and out.outputs[1].text == want
