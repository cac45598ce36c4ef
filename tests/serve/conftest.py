"""Servers on free loopback ports, each in a background thread of the test process, on the
embedded draft model (0.9M parameters: a request takes milliseconds)."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from inferlab.serve.launcher import ServerThread, make_app  # noqa: E402


@pytest.fixture(scope="session")
def server():
    with ServerThread(make_app("draft", device="cpu", max_num_seqs=8, num_kv_blocks=128)) as s:
        yield s


@pytest.fixture(scope="session")
def small_pool_server():
    """12 blocks of 16 slots: room for two or three of the test's requests at a time."""
    app = make_app("draft", device="cpu", max_num_seqs=8, num_kv_blocks=12, block_size=16)
    with ServerThread(app) as s:
        yield s


@pytest.fixture()
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def on_engine(server, fn, timeout: float = 30.0):
    """Run ``fn(engine)`` in the server's engine thread (the only thread that may touch it)."""
    return server.app.state.engine.call(fn).result(timeout)


def wait_idle(server, timeout: float = 30.0) -> dict:
    """Wait until the engine holds no request; its KV statistics then."""
    deadline = time.monotonic() + timeout
    while True:
        stats = on_engine(server, lambda e: {**e.kv_cache_stats(), "requests": len(e.requests)})
        if (stats["requests"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0) \
                or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)
