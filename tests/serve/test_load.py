"""Under load and when clients leave: requests queue instead of failing, and a client that goes
away has its request aborted and its KV blocks freed."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
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
        # the client gives up after 50 ms: the embedded draft decodes well over 1,000 tokens/s on one
        # CPU, so a client waiting 0.2 s could already have been served 250 tokens before it left
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=0.05)
        raise AssertionError("the answer came before the client gave up: make the request longer")
    except httpx.ReadTimeout:
        pass
    stats = wait_idle(server, timeout=10)
    assert stats["requests"] == 0 and stats["used_blocks"] == 0
    assert _generated(server) - before < 250


def test_a_full_queue_answers_429_and_every_admitted_request_completes():
    """A burst bigger than the waiting queue: the excess gets 429 with Retry-After, at once; every
    admitted request runs to its end; the queue never holds more than its bound; no KV block is
    left behind; and /health answers throughout, even while the engine is stuck in a long step.

    Two bursts: the first lands while the engine is stuck (a command that waits on a gate stands
    in for a slow step), so it is bounded at the door (requests being admitted): the excess must
    be refused while the engine is still stuck. The second lands while two requests wait to run,
    so it is bounded by the engine's waiting queue."""
    import threading

    from inferlab.serve.launcher import ServerThread, make_app
    from inferlab.serve.limits import ServerLimits

    max_waiting = 4
    app = make_app("draft", device="cpu", max_num_seqs=2, num_kv_blocks=64,
                   limits=ServerLimits(max_waiting_requests=max_waiting, max_prompts=4))
    with ServerThread(app) as server:
        waiting = []
        on_engine(server, lambda e: e.step_hooks.append(lambda _, rec: waiting.append(rec["num_waiting"])))
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        health = []

        async def one(i):
            try:
                return await client.completions.create(model="draft", prompt=f"def f{i}(x):", max_tokens=100,
                                                       temperature=0, extra_body={"ignore_eos": True})
            except openai.RateLimitError as exc:
                return exc

        async def watch(done: asyncio.Event):
            async with httpx.AsyncClient(timeout=10) as http:
                while not done.is_set():
                    t0 = time.monotonic()
                    status = (await http.get(server.url + "/health")).status_code
                    health.append((status, time.monotonic() - t0))
                    await asyncio.sleep(0.02)

        async def run():
            done = asyncio.Event()
            watcher = asyncio.ensure_future(watch(done))
            gate = threading.Event()
            stuck = server.app.state.engine.call(lambda e: gate.wait(60))
            first = [asyncio.ensure_future(one(i)) for i in range(20)]
            deadline = time.monotonic() + 20
            while sum(t.done() for t in first) < 20 - max_waiting:  # refused at once, engine still stuck
                assert time.monotonic() < deadline, "the excess was not refused while the engine was stuck"
                await asyncio.sleep(0.01)
            gate.set()
            await asyncio.wrap_future(stuck)
            await asyncio.sleep(0.05)  # the admitted four are in: two run, two wait
            second = await asyncio.gather(*[one(i) for i in range(20, 32)])
            outs = await asyncio.gather(*first) + second
            done.set()
            await watcher
            return outs[:20], outs[20:]

        first, second = asyncio.run(run())
        for burst in (first, second):
            refused = [o for o in burst if isinstance(o, openai.RateLimitError)]
            served = [o for o in burst if not isinstance(o, openai.RateLimitError)]
            assert refused and served, (len(refused), len(served))
            for e in refused:
                assert e.status_code == 429 and e.response.headers["retry-after"] == "1"
                assert e.type == "RateLimitError" and "busy" in e.message
            assert all(o.choices[0].finish_reason == "length" and o.usage.completion_tokens == 100 for o in served)
        assert len([o for o in first if not isinstance(o, Exception)]) == max_waiting
        assert max(waiting) <= max_waiting
        assert all(status == 200 for status, _ in health) and len(health) >= 5  # polled all along (a fast machine polls less)
        assert max(seconds for _, seconds in health) < 1.0  # never behind the stuck engine
        stats = wait_idle(server)
        assert stats["requests"] == 0 and stats["free_blocks"] == stats["total_blocks"]
        print(f"served {[sum(not isinstance(o, Exception) for o in b) for b in (first, second)]} of 20 + 12, "
              f"most waiting {max(waiting)}, {len(health)} /health answers, slowest "
              f"{max(s for _, s in health):.3f} s")
