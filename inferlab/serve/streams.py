"""Outputs on their way to a client: one request's stream, several merged, and server-sent events.

The engine thread hands each output to its request's ``RequestStream``; the event loop reads it.
Every buffer on this path is bounded, so a client that reads slowly (or not at all) costs a fixed
amount of memory: a stream holds one unread output, merging newer ones into it; a merge of
several streams holds one item per stream; and the SSE response is pulled by the socket.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from typing import AsyncIterator

from inferlab.outputs import RequestOutput
from inferlab.serve import protocol as P

log = logging.getLogger("inferlab.serve")


class RequestStream:
    """One request's outputs, crossing from the engine thread to the event loop. Iterate it to get
    the outputs until the request finishes; leaving the iteration early aborts the request.

    It holds at most one output not yet read (vLLM v1's ``RequestOutputCollector``): when the
    reader falls behind (a slow client, a busy event loop), the engine thread merges the next
    output into the waiting one, text deltas concatenated and the cumulative fields replaced, and
    wakes the reader only when the slot was empty. A slow reader costs one output's memory and
    one pending wake-up, never a backlog of steps."""

    def __init__(self, owner, request_id: str, loop: asyncio.AbstractEventLoop):
        self.owner, self.request_id, self.loop = owner, request_id, loop
        self.pending: RequestOutput | BaseException | None = None
        self.lock = threading.Lock()  # the slot is shared by the engine thread and the event loop
        self.ready = asyncio.Event()
        self.finished = False

    def put(self, item) -> None:  # called in the engine thread
        with self.lock:
            wake = self.pending is None
            if wake or isinstance(item, BaseException):
                self.pending = item
            elif not isinstance(self.pending, BaseException):
                self.pending = merge_outputs(self.pending, item)
        if wake:
            try:
                self.loop.call_soon_threadsafe(self.ready.set)
            except RuntimeError:  # the event loop is closed (shutting down): nobody is listening
                pass

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                await self.ready.wait()
                with self.lock:
                    self.ready.clear()
                    item, self.pending = self.pending, None
                if item is None:  # a wake-up for an output already taken
                    continue
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


def merge_outputs(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    """``new`` carrying ``old``'s unread deltas in front of its own (per completion index)."""
    before = {c.index: c for c in old.outputs}
    outputs = []
    for c in new.outputs:
        o = before.get(c.index)
        if o is not None:
            c = dataclasses.replace(c, delta_text=o.delta_text + c.delta_text,
                                    delta_token_ids=o.delta_token_ids + c.delta_token_ids)
        outputs.append(c)
    return dataclasses.replace(new, outputs=outputs)


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) from several streams in arrival order; leaving early aborts them all."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    merged: asyncio.Queue = asyncio.Queue(maxsize=len(streams))  # bounded: a slow reader lets streams merge

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


class EventStream:
    """A streaming answer: its SSE lines, and the engine requests to abort if it is never read."""

    def __init__(self, events: AsyncIterator[str], streams: list[RequestStream]):
        self.events, self.streams = sse_stream(events), streams

    def close(self) -> None:
        for s in self.streams:
            s.abort()


def sse(model) -> str:
    return f"data: {model.model_dump_json()}\n\n"


async def sse_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The events, an error event if generation failed midway (the status line is already sent),
    and the closing ``data: [DONE]``."""
    try:
        async for e in events:
            yield e
    except Exception as exc:
        log.exception("generation failed mid-stream")
        yield f"data: {json.dumps(P.error_body(f'generation failed: {exc}', status=500))}\n\n"
    yield "data: [DONE]\n\n"
