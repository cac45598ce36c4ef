"""``AsyncLLMEngine``: the ``LLMEngine`` behind an asyncio API, for the HTTP server.

The engine is not thread-safe, so exactly one thread owns it: the *engine loop*. It runs

    while True:
        run every command that arrived (add a request, abort one, read statistics)
        if requests are unfinished: outputs = engine.step(); hand each to its request's stream
        else: sleep until the next command arrives

HTTP handlers live on the asyncio event loop and never touch the engine: they post commands
(plain callables) to a thread-safe inbox and read their request's ``RequestStream`` (streams.py:
at most one unread output), which the engine loop fills with ``loop.call_soon_threadsafe``.
Because the model's forward pass runs in the engine thread (and torch releases the GIL inside its
kernels), the event loop keeps accepting and streaming while the engine computes: new requests
join the running batch at the next step, which is continuous batching seen from the outside.
vLLM's ``AsyncLLM`` has the same shape, with the engine in its own process instead of a thread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from typing import Callable

from inferlab.engine.llm_engine import LLMEngine
from inferlab.outputs import RequestOutput
from inferlab.sampling import SamplingParams
from inferlab.serve.limits import QueueFullError
from inferlab.serve.streams import RequestStream

log = logging.getLogger("inferlab.serve")


class EngineDeadError(RuntimeError):
    """The engine loop stopped; the server cannot answer until it is restarted."""


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, on_step: Callable[[LLMEngine, list[RequestOutput]], None] | None = None):
        self.engine = engine
        self.on_step = on_step  # called in the engine thread after each step (metrics)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="inferlab-engine", daemon=True)
        self._thread.start()

    # ---- the event loop's side ----------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def call(self, fn: Callable[[LLMEngine], object]) -> concurrent.futures.Future:
        """Run ``fn(engine)`` in the engine thread between two steps; a future of its result."""
        if not self.is_running:
            raise EngineDeadError(f"the engine loop has stopped: {self.error!r}")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put((fn, fut))
        return fut

    async def run(self, fn: Callable[[LLMEngine], object]):
        return await asyncio.wrap_future(self.call(fn))

    async def add_requests(self, requests: list[tuple[str, list[int], SamplingParams]], stream: bool = True,
                           arrival_time: float | None = None, max_waiting: int | None = None,
                           priority: int = 0) -> list[RequestStream]:
        """Queue ``requests`` ((id, prompt ids, params) each) all together or none; iterate each
        returned stream for its outputs. ``stream=False`` adds them final-only: the engine reports
        each once, finished, so no per-step output crosses the threads. ``max_waiting``: refuse with
        ``QueueFullError`` if the requests waiting to run would then number more. ``ValueError``
        from ``LLMEngine.add_request`` (a prompt too long for the pool, a priority the engine's
        scheduling policy does not take...) is raised here."""
        loop = asyncio.get_running_loop()
        streams = [RequestStream(self, rid, loop) for rid, _, _ in requests]
        arrival = time.monotonic() if arrival_time is None else arrival_time

        def add(engine: LLMEngine) -> None:
            if max_waiting is not None:
                waiting = len({seq.request_id for seq in engine.scheduler.waiting})
                if waiting + len(requests) > max_waiting:
                    raise QueueFullError(f"the server is busy: {waiting} requests are waiting to run (at most "
                                         f"{max_waiting}): retry later")
            added = []
            try:
                for (rid, ids, params), s in zip(requests, streams):
                    engine.add_request(rid, ids, params, arrival_time=arrival, stream=stream, priority=priority)
                    added.append(rid)
                    self._streams[rid] = s
            except BaseException:
                for rid in added:
                    self._streams.pop(rid, None)
                    engine.abort_request(rid)
                raise

        try:
            await self.run(add)
        except asyncio.CancelledError:  # the add may have run: do not leave the requests behind
            for rid, _, _ in requests:
                self.abort(rid)
            raise
        return streams

    async def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                          arrival_time: float | None = None, stream: bool = True) -> RequestStream:
        """One request; see ``add_requests``."""
        (s,) = await self.add_requests([(request_id, prompt_token_ids, params)], stream, arrival_time)
        return s

    def abort(self, request_id: str) -> None:
        """Abort from any thread; a request already finished is left alone."""
        def abort(engine: LLMEngine) -> None:
            self._streams.pop(request_id, None)
            engine.abort_request(request_id)

        if self.is_running:
            self.call(abort)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._inbox.put((None, None))
        self._thread.join(timeout)

    # ---- the engine thread's side -------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._run_commands(block=not self.engine.has_unfinished_requests())
                if self._stopping or not self.engine.has_unfinished_requests():
                    continue
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # fail the requests in flight, keep serving new ones
                    log.exception("engine step failed; aborting the requests in flight")
                    self._fail_all(exc)
                    continue
                for out in outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        stream.put(out)
                        if out.finished:
                            del self._streams[out.request_id]
                if self.on_step is not None:
                    try:
                        self.on_step(self.engine, outputs)
                    except Exception:
                        log.exception("on_step failed")
        except BaseException as exc:  # pragma: no cover - a bug in the loop itself
            log.exception("the engine loop died")
            self.error = exc
            self._fail_all(EngineDeadError(f"the engine loop died: {exc!r}"))
            raise

    def _run_commands(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            fn, fut = item
            if fn is None:
                return
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except Exception as exc:
                    fut.set_exception(exc)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _fail_all(self, exc: BaseException) -> None:
        for request_id, stream in list(self._streams.items()):
            stream.put(exc)
            self.engine.abort_request(request_id)
        self._streams.clear()
