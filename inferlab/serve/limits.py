"""What the server refuses before it computes anything: caps on a request's size, the API key, and
the bound on the waiting queue.

A server that takes whatever arrives can be made to hold any amount of memory by one client: a
100 MB body, 10,000 prompts in one request, 10,000 stop strings checked after every token, a
backlog of requests that grows while the engine is busy. Each cap here turns one of those into an
immediate OpenAI-shaped error that says which limit was hit and how to stay under it:

    body bytes      > max_body_bytes          400 (read at most that many bytes, then stop)
    prompts         > max_prompts             400 param "prompt"
    stop strings    > max_stop, or longer
                      than max_stop_chars     400 param "stop"
    messages        > max_messages            400 param "messages"
    waiting queue   full                      429 with Retry-After (the client backs off, retries)
    API key         wrong or missing          401 (``--api-key``, as ``vllm serve --api-key``)

OpenAI's own API allows at most 4 stop sequences and 2,048 messages; vLLM caps none of these by
default. The defaults below are loose enough for any real client and tight enough that no single
request costs more than a few MB.
"""
from __future__ import annotations

import dataclasses
import json
import secrets

GUARDED_PREFIX = "/v1"  # the API; /health and /metrics stay open: probes and scrapers carry no key


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 4 << 20      # a request body, in bytes
    max_prompts: int = 64              # prompts in one /v1/completions request
    max_stop: int = 16                 # stop strings (and stop_token_ids) per request
    max_stop_chars: int = 256          # characters in one stop string
    max_messages: int = 2048           # messages in one chat request (OpenAI's cap)
    max_waiting_requests: int = 256    # engine requests queued and not yet running
    retry_after_s: int = 1             # the Retry-After a 429 carries
    api_key: str | None = None         # when set, /v1/* needs "Authorization: Bearer <key>"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "api_key" and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{f.name} must be a positive integer, got {v!r}")
        if self.max_prompts > self.max_waiting_requests:
            raise ValueError(f"max_prompts ({self.max_prompts}) exceeds max_waiting_requests "
                             f"({self.max_waiting_requests}): such a request could never be queued")
        if self.api_key == "":
            raise ValueError("the API key is empty: give a non-empty key or none")


class QueueFullError(Exception):
    """The waiting queue has no room for this request now: answered 429 with Retry-After."""


def request_problem(req, limits: ServerLimits) -> tuple[str, str] | None:
    """(one-line message, param) for the first cap ``req`` breaks, or None."""
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stop) > limits.max_stop:
        return (f"{len(stop)} stop strings given, this server takes at most {limits.max_stop}: "
                f"send fewer (--max-stop)", "stop")
    if any(not s for s in stop):
        return "a stop string is empty, which would stop before the first token: remove it", "stop"
    long = next((s for s in stop if len(s) > limits.max_stop_chars), None)
    if long is not None:
        return (f"a stop string has {len(long)} characters, this server takes at most {limits.max_stop_chars}: "
                f"shorten it (--max-stop-chars)", "stop")
    if req.stop_token_ids and len(req.stop_token_ids) > limits.max_stop:
        return (f"{len(req.stop_token_ids)} stop_token_ids given, this server takes at most {limits.max_stop}: "
                f"send fewer (--max-stop)", "stop_token_ids")
    messages = getattr(req, "messages", None)
    if messages is not None and len(messages) > limits.max_messages:
        return (f"{len(messages)} messages given, this server takes at most {limits.max_messages}: "
                f"drop the oldest (--max-messages)", "messages")
    prompt = getattr(req, "prompt", None)
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > limits.max_prompts:
        return (f"{len(prompt)} prompts given, this server takes at most {limits.max_prompts} per request: "
                f"split them over several requests (--max-prompts)", "prompt")
    return None


# ---- ASGI middleware: run before FastAPI parses anything -----------------------------------------
async def _send_error(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


class BodySizeLimit:
    """Refuse a body over ``max_bytes`` without holding more than that: a Content-Length over the cap
    is refused unread; a chunked body is read until it passes the cap. The body read is handed to
    the app as if it came from the client, and later messages (a disconnect) pass through."""

    def __init__(self, app, max_bytes: int, error_body):
        self.app, self.max_bytes, self.error_body = app, max_bytes, error_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send, int(length))
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refuse(send, None)
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send, length: int | None):
        size = f"{length} bytes" if length is not None else f"over {self.max_bytes} bytes"
        await _send_error(send, 400, self.error_body(
            f"the request body is {size}, this server takes at most {self.max_bytes}: send a smaller request "
            f"(--max-body-bytes)", None, 400))


class ApiKeyCheck:
    """``Authorization: Bearer <key>`` on the API's paths (/v1/...), and only there, as vLLM's
    --api-key: load balancers' health probes and Prometheus scrapers carry no key."""

    def __init__(self, app, api_key: str, error_body):
        self.app, self.error_body = app, error_body
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == GUARDED_PREFIX or path.startswith(GUARDED_PREFIX + "/")):
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if not secrets.compare_digest(given, self.expected):
            what = "no API key was given" if not given else "the API key is not valid"
            return await _send_error(send, 401, self.error_body(
                f"{what}: send the server's key as 'Authorization: Bearer <key>'", None, 401),
                [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)
