"""``inferlab serve``: an OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn, as vLLM).

    POST /v1/completions         prompt -> text, streamed as server-sent events with "stream": true
    POST /v1/chat/completions    messages -> reply (the model's chat template, see inferlab/model/chat.py)
    GET  /v1/models              the served model
    GET  /health                 200 while the engine loop runs, 503 after it died
    GET  /metrics                Prometheus text format, vLLM's metric names (metrics.py)

Any OpenAI client talks to it: ``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")``.
Refused requests get OpenAI's error JSON (``{"error": {"message", "type", "param", "code"}}``),
never a stack trace: 400 for a bad or oversized request, 401 for a wrong API key, 404 for a model
or route the server does not have, 405 for a wrong method, 429 with ``Retry-After`` when the
waiting queue is full (``limits.py``). The official client raises its typed exception for each.
A client that goes away mid-request has its request aborted, which frees its KV blocks; requests
that arrive while the KV pool is full wait in the scheduler's queue, up to its bound.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferlab.model.chat import ChatTemplate
from inferlab.serve import protocol as P
from inferlab.serve.async_engine import AsyncLLMEngine, EngineDeadError
from inferlab.serve.limits import ApiKeyCheck, BodySizeLimit, QueueFullError, ServerLimits
from inferlab.serve.metrics import CONTENT_TYPE, ServerMetrics, engine_stats
from inferlab.serve.serving import ApiError, EventStream, OpenAIServing

log = logging.getLogger("inferlab.serve")


def build_app(engine, tokenizer, model_name: str, chat_template: ChatTemplate | None = None,
              root: str | None = None, limits: ServerLimits | None = None) -> FastAPI:
    """The ASGI app over an ``LLMEngine``; it starts the engine loop now and stops it at shutdown.
    Chat uses the tokenizer's template unless ``chat_template`` overrides it."""
    limits = limits or ServerLimits()
    metrics = ServerMetrics(model_name)
    async_engine = AsyncLLMEngine(engine, on_step=metrics.observe)
    serving = OpenAIServing(async_engine, tokenizer, model_name, chat_template, root, limits)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        async_engine.shutdown()
        serving.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="inferlab", lifespan=lifespan)
    app.state.engine, app.state.serving, app.state.metrics = async_engine, serving, metrics
    app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes, error_body=P.error_body)
    if limits.api_key is not None:  # added last, so it runs first: no body is read for a stranger
        app.add_middleware(ApiKeyCheck, api_key=limits.api_key, error_body=P.error_body)

    @app.exception_handler(ApiError)
    async def api_error(_, exc: ApiError):
        return JSONResponse(P.error_body(str(exc), exc.param, exc.status), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, exc: RequestValidationError):
        return JSONResponse(P.error_body(*_describe(exc), status=400), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # unknown route, wrong method
        allow = (getattr(exc, "headers", None) or {}).get("Allow")
        message = {404: f"there is no route {request.url.path}: the API is under /v1 (/v1/models, "
                        f"/v1/completions, /v1/chat/completions)",
                   405: f"{request.url.path} does not take {request.method}: use {allow}"}.get(
            exc.status_code, str(exc.detail))
        return JSONResponse(P.error_body(message, status=exc.status_code), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(QueueFullError)
    async def queue_full(_, exc: QueueFullError):
        return JSONResponse(P.error_body(str(exc), status=429), status_code=429,
                            headers={"Retry-After": str(limits.retry_after_s)})

    @app.exception_handler(EngineDeadError)
    async def dead(_, exc: EngineDeadError):
        return JSONResponse(P.error_body(str(exc), status=503), status_code=503)

    @app.exception_handler(Exception)
    async def internal(_, exc: Exception):
        log.error("internal error", exc_info=exc)  # the trace stays in the server's log
        return JSONResponse(P.error_body(f"internal error: {type(exc).__name__}", status=500), status_code=500)

    @app.get("/health")
    async def health():
        if not async_engine.is_running:
            return JSONResponse(P.error_body("the engine loop has stopped", status=503), status_code=503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return serving.models()

    @app.get("/metrics")
    async def prometheus():
        stats = await async_engine.run(engine_stats)
        return Response(metrics.render(stats), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, raw: Request):
        return await _respond(serving.completions(body), raw, body.stream)

    @app.post("/v1/chat/completions")
    async def chat(body: P.ChatCompletionRequest, raw: Request):
        return await _respond(serving.chat(body), raw, body.stream)

    return app


async def _respond(work, raw: Request, stream: bool):
    """Run a handler until it answers or the client disconnects (then it is cancelled, which aborts
    its engine requests). A stream is aborted the same way when starlette stops sending it."""
    result = await _unless_disconnected(work, raw)
    if result is None:
        return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
    if stream:
        return _SSEResponse(result)
    return JSONResponse(result.model_dump())


class _SSEResponse(StreamingResponse):
    """Server-sent events; whatever ends the response (done, client gone) aborts what is left."""

    def __init__(self, stream: EventStream):
        super().__init__(stream.events, media_type="text/event-stream")
        self.stream = stream

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.stream.close()


async def _unless_disconnected(work, raw: Request):
    task = asyncio.ensure_future(work)

    async def disconnected():
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        return None
    return task.result()


def _describe(exc: RequestValidationError) -> tuple[str, str | None]:
    """pydantic's first complaint as one line and the field it is about."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    if e.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if not loc:
        return "the request body must be a JSON object", None
    return f"{'.'.join(loc)}: {e.get('msg')}", loc[0]
