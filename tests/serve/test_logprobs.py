"""Log-probabilities through the server, parsed by the official ``openai`` client: completions'
``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset), ``echo`` scoring the prompt,
``max_tokens: 0`` scoring it alone (as evaluation harnesses ask), chat's ``logprobs`` and
``top_logprobs``, and streaming carrying them chunk by chunk; the numbers are the engine's, and the
prompt's are transformers' log-softmax on the same weights."""
from __future__ import annotations

import httpx
import pytest
import torch

from inferlab.llm import LLM
from inferlab.model.loader import ASSETS
from inferlab.sampling import SamplingParams

PROMPT = "def fibonacci(n):"
TOL = 1e-4


@pytest.fixture(scope="module")
def offline():
    return LLM("draft", device="cpu")


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(str(ASSETS / "draft"), dtype=torch.float32).eval()


def reference(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def check_shape(lp, text: str, n: int):
    """The four lists line up, the tokens spell the text, each top list holds the chosen token."""
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        if top is not None:
            assert top[tok] == value and n <= len(top) <= n + 1 and max(top.values()) <= 0


def test_completion_logprobs_are_the_engines(client, offline):
    r = client.completions.create(model="draft", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3)
    choice = r.choices[0]
    check_shape(choice.logprobs, choice.text, 3)
    want = offline.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, logprobs=3))[0].outputs[0]
    assert len(choice.logprobs.tokens) == r.usage.completion_tokens == len(want.token_ids)
    got = choice.logprobs.token_logprobs
    assert max(abs(a - e[t].logprob) for a, t, e in zip(got, want.token_ids, want.logprobs)) <= 1e-6


def test_echo_with_max_tokens_0_scores_the_prompt_alone(client, offline, hf):
    """lm-eval's loglikelihood request: token ids, echo, logprobs 1, nothing generated."""
    ids = offline.encode(PROMPT + "\n    return n")
    r = client.completions.create(model="draft", prompt=[ids], max_tokens=0, echo=True, logprobs=1, temperature=0)
    choice = r.choices[0]
    assert choice.text == PROMPT + "\n    return n" and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    check_shape(lp, choice.text, 1)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.tokens) == len(ids)
    ref = reference(hf, ids)
    worst = max(abs(lp.token_logprobs[t] - float(ref[t - 1, ids[t]])) for t in range(1, len(ids)))
    print(f"echo scoring: max |logprob - transformers| = {worst:.2e}")
    assert worst <= TOL


def test_echo_with_generation_scores_prompt_then_completion(client):
    r = client.completions.create(model="draft", prompt=PROMPT, max_tokens=5, echo=True, logprobs=2, temperature=0,
                                  n=2)  # echo with n > 1: each choice carries the prompt's scores
    a, b = r.choices
    for c in (a, b):
        check_shape(c.logprobs, c.text, 2)
        assert len(c.logprobs.tokens) == r.usage.prompt_tokens + 5 and c.text.startswith(PROMPT)
    assert a.logprobs.token_logprobs[:r.usage.prompt_tokens] == b.logprobs.token_logprobs[:r.usage.prompt_tokens]


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_completion_logprobs_equal_the_whole(client, echo):
    kw = dict(model="draft", prompt="import os\n", max_tokens=16, temperature=0, logprobs=2, echo=echo)
    whole = client.completions.create(**kw).choices[0].logprobs
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True) if c.choices]
    parts = [c.logprobs for c in chunks if c.logprobs is not None]
    # several pieces (one a step; a reader that falls behind gets the steps it missed merged into
    # one, inferlab/serve/streams.py, so how many depends on the machine's load)
    assert len(parts) > 1
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for p in parts for x in getattr(p, field)] == getattr(whole, field), field


def test_streamed_scoring_only_sends_the_prompt_and_a_finish(client):
    chunks = [c.choices[0] for c in client.completions.create(model="draft", prompt="x = 1\n", max_tokens=0,
                                                              echo=True, logprobs=0, stream=True) if c.choices]
    assert [c.text for c in chunks] == ["x = 1\n", ""] and chunks[-1].finish_reason == "length"
    assert chunks[0].logprobs.token_logprobs[0] is None and len(chunks[0].logprobs.tokens) > 1


def test_chat_logprobs_and_top_logprobs(client):
    kw = dict(model="draft", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=10,
              temperature=0, logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.logprob <= item.top_logprobs[0].logprob + 1e-6 and item.bytes == list(item.token.encode())
    streamed = [c.choices[0].logprobs for c in client.chat.completions.create(**kw, stream=True)
                if c.choices and c.choices[0].logprobs is not None]
    assert [i.model_dump() for p in streamed for i in p.content] == [i.model_dump() for i in content]
    plain = client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_without_logprobs_nothing_is_sent(client):
    r = client.completions.create(model="draft", prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),  # scoring only needs echo
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 1}, "top_logprobs"),
])
def test_bad_logprob_requests_are_one_line_400s(server, body, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "BadRequestError" and "\n" not in err["message"]


def test_serve_flags_reach_the_engine(monkeypatch, capsys):
    """`inferlab serve --max-logprobs 5 --logprobs-mode processed_logprobs`: the server caps at 5."""
    from inferlab.cli import main
    from inferlab.serve import launcher

    apps = []
    monkeypatch.setattr(launcher, "serve", lambda app, *args: apps.append(app))
    assert main(["serve", "--model", "draft", "--device", "cpu", "--max-num-seqs", "2", "--max-logprobs", "5",
                 "--logprobs-mode", "processed_logprobs"]) == 0
    (app,) = apps
    config = app.state.engine.engine.config
    assert (config.max_logprobs, config.logprobs_mode) == (5, "processed_logprobs")
    with launcher.ServerThread(app) as server:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "logprobs": 6})
        assert r.status_code == 400 and "from 0 to 5" in r.json()["error"]["message"]
    with pytest.raises(SystemExit):
        main(["serve", "--max-logprobs", "-1"])
    assert "--max-logprobs must be >= 0" in capsys.readouterr().err
