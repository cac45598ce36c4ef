"""Under load and when clients leave: requests queue instead of failing, and a client that goes
away has its request aborted and its KV blocks freed."""
from __future__ import annotations

import asyncio
import json

import httpx
from openai import AsyncOpenAI

from inferlab.llm import LLM
from inferlab.sampling import SamplingParams
from serve.conftest import on_engine, wait_idle

PROMPTS = [f"def f{i}(x):" for i in range(16)]


def test_more_requests_than_the_pool_holds_all_complete(small_pool_server):
    """16 requests of ~70 tokens (5 blocks each) against a 12-block pool: at most two fit at once,
    the rest wait in the scheduler's queue; all finish, with the text they get alone."""
    server = small_pool_server
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    waiting_seen = []

    async def watch(done: asyncio.Event):
        async with httpx.AsyncClient() as http:
            while not done.is_set():
                text = (await http.get(server.url + "/metrics")).text
                line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_waiting{"))
                waiting_seen.append(float(line.split()[-1]))
                await asyncio.sleep(0.02)

    async def run():
        done = asyncio.Event()
        watcher = asyncio.ensure_future(watch(done))
        outs = await asyncio.gather(*[
            client.completions.create(model="draft", prompt=p, max_tokens=64, temperature=0,
                                      extra_body={"ignore_eos": True}) for p in PROMPTS])
        done.set()
        await watcher
        return outs

    outs = asyncio.run(run())
    assert all(o.choices[0].finish_reason == "length" and o.usage.completion_tokens == 64 for o in outs)
    assert max(waiting_seen) >= 8  # most of them really queued
    want = LLM("draft", device="cpu").generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    assert [o.choices[0].text for o in outs] == [w.outputs[0].text for w in want]
    stats = wait_idle(server)
    assert stats["used_blocks"] == 0 and stats["free_blocks"] == stats["total_blocks"]


def _generated(server) -> int:
    return on_engine(server, lambda e: e.counters["num_generation_tokens"])


LONG = {"model": "draft", "prompt": "import os", "max_tokens": 500, "temperature": 0, "ignore_eos": True}


def test_client_leaving_mid_stream_aborts_its_request(server):
    wait_idle(server)
    before = _generated(server)
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}) as r:
            chunks = []
            for x in r.iter_lines():
                if x.startswith("data: {"):
                    chunks.append(json.loads(x[6:]))
                if len(chunks) == 3:
                    break
    # the connection is closed here, 3 tokens in
    stats = wait_idle(server, timeout=10)
    assert stats["requests"] == 0 and stats["used_blocks"] == 0
    assert _generated(server) - before < 250  # far from the 500 it asked for


def test_client_leaving_before_the_answer_aborts_its_request(server):
    wait_idle(server)
    before = _generated(server)
    try:
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=0.2)
        raise AssertionError("the answer came before the client gave up: make the request longer")
    except httpx.ReadTimeout:
        pass
    stats = wait_idle(server, timeout=10)
    assert stats["requests"] == 0 and stats["used_blocks"] == 0
    assert _generated(server) - before < 250
