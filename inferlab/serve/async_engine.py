"""``AsyncLLMEngine``: the ``LLMEngine`` behind an asyncio API, for the HTTP server.

The engine is not thread-safe, so exactly one thread owns it: the *engine loop*. It runs

    while True:
        run every command that arrived (add a request, abort one, read statistics)
        if requests are unfinished: outputs = engine.step(); hand each to its request's queue
        else: sleep until the next command arrives

HTTP handlers live on the asyncio event loop and never touch the engine: they post commands
(plain callables) to a thread-safe inbox and read their request's ``asyncio.Queue``, which the
engine loop fills with ``loop.call_soon_threadsafe``. Because the model's forward pass runs in the
engine thread (and torch releases the GIL inside its kernels), the event loop keeps accepting and
streaming while the engine computes: new requests join the running batch at the next step, which
is continuous batching seen from the outside. vLLM's ``AsyncLLM`` has the same shape, with the
engine in its own process instead of a thread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from typing import AsyncIterator, Callable

from inferlab.engine.llm_engine import LLMEngine
from inferlab.outputs import RequestOutput
from inferlab.sampling import SamplingParams

log = logging.getLogger("inferlab.serve")


class EngineDeadError(RuntimeError):
    """The engine loop stopped; the server cannot answer until it is restarted."""


class RequestStream:
    """One request's outputs, crossing from the engine thread to the event loop. Iterate it to get
    the outputs until the request finishes; leaving the iteration early aborts the request."""

    def __init__(self, owner: "AsyncLLMEngine", request_id: str, loop: asyncio.AbstractEventLoop):
        self.owner, self.request_id = owner, request_id
        self.loop, self.queue = loop, asyncio.Queue()
        self.finished = False

    def put(self, item) -> None:  # called in the engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed (shutting down): nobody is listening
            pass

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self.queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            self.abort()

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self.owner.abort(self.request_id)


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

    async def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                          arrival_time: float | None = None) -> RequestStream:
        """Queue a request; iterate the returned stream for its outputs (text deltas).
        ``ValueError`` from ``LLMEngine.add_request`` (a prompt too long for the pool...) is raised here."""
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        arrival = time.monotonic() if arrival_time is None else arrival_time

        def add(engine: LLMEngine) -> None:
            engine.add_request(request_id, prompt_token_ids, params, arrival_time=arrival)
            self._streams[request_id] = stream

        try:
            await self.run(add)
        except asyncio.CancelledError:  # the add may have run: do not leave the request behind
            self.abort(request_id)
            raise
        return stream

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


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) from several streams in arrival order; leaving early aborts them all."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(i, stream):
        try:
            async for out in stream:
                await merged.put((i, out))
        except Exception as exc:
            await merged.put((i, exc))
        await merged.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, item = await merged.get()
            if item is None:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()


async def collect_finals(streams: list[RequestStream]) -> list[RequestOutput]:
    finals: list = [None] * len(streams)
    async for i, out in merge_streams(streams):
        if out.finished:
            finals[i] = out
    return finals
