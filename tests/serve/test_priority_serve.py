"""vLLM's `priority` request field: under `--scheduling-policy priority` a late urgent request is
served before earlier background ones; a first-come-first-served server refuses it in one line."""
from __future__ import annotations

import asyncio
import threading

import pytest
from openai import AsyncOpenAI, BadRequestError, OpenAI

from inferlab.serve.launcher import ServerThread, make_app


def test_a_late_urgent_request_overtakes_the_queue():
    app = make_app("draft", device="cpu", max_num_seqs=1, num_kv_blocks=64, scheduling_policy="priority")
    with ServerThread(app) as server:
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        done: list[str] = []

        async def one(name: str, priority: int):
            await client.completions.create(model="draft", prompt=f"def {name}(x):", max_tokens=8, temperature=0,
                                            extra_body={"priority": priority, "ignore_eos": True})
            done.append(name)

        async def run():
            gate = threading.Event()
            stuck = server.app.state.engine.call(lambda e: gate.wait(30))  # hold the engine loop
            background = [asyncio.ensure_future(one(f"job{i}", 10)) for i in range(3)]
            await asyncio.sleep(0.3)
            urgent = asyncio.ensure_future(one("urgent", 0))
            await asyncio.sleep(0.3)  # every request is queued before the engine moves again
            gate.set()
            await asyncio.wrap_future(stuck)
            await asyncio.gather(urgent, *background)

        asyncio.run(run())
    assert done[0] == "urgent" and sorted(done[1:]) == ["job0", "job1", "job2"], done


def test_a_fcfs_server_refuses_a_priority(server):
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(BadRequestError, match="scheduling_policy"):
        client.completions.create(model="draft", prompt="x", max_tokens=2, extra_body={"priority": 3})
    ok = client.completions.create(model="draft", prompt="x", max_tokens=2, extra_body={"priority": 0})
    assert ok.choices[0].text is not None
