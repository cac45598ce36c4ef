"""The benchmark's client side: send a workload to any OpenAI-compatible server and time it.

Each request is sent at its arrival time (``arrival_s`` after the start; a Poisson process in
``make_workload``) to ``POST /v1/completions`` with ``"stream": true``, and timed from the client
as a user sees it, the way vLLM's ``benchmark_serving`` does:

    TTFT   the request is sent -> its first text arrives
    TPOT   (last text - first text) / (output tokens - 1)
    tokens/s  output tokens of all completed requests / (first send -> last answer)

The output-token count is the server's own (``stream_options.include_usage``); a server that does
not send usage is counted one token per streamed chunk. ``ignore_eos`` (a vLLM and SGLang
extension) makes outputs exactly ``max_tokens`` long so that two servers do the same work.
The same client works against ``inferlab serve``, vLLM and SGLang.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx

from inferlab.bench.stats import percentile
from inferlab.errors import InferlabError


async def _one(http: httpx.AsyncClient, url: str, model: str, req: dict, start: float, ignore_eos: bool) -> dict:
    await asyncio.sleep(max(0.0, start + req.get("arrival_s", 0.0) - time.perf_counter()))
    body = {"model": model, "prompt": req["prompt"], "max_tokens": req["max_tokens"], "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    sent = time.perf_counter()
    first = last = None
    chunks, usage = 0, None
    try:
        async with http.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                detail = (await r.aread()).decode(errors="replace")[:300]
                return {"ok": False, "error": f"HTTP {r.status_code}: {detail}"}
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return {"ok": False, "error": str(event["error"])}
                if event.get("usage"):
                    usage = event["usage"]
                if any(c.get("text") for c in event.get("choices") or ()):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
    except httpx.HTTPError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if first is None:
        return {"ok": False, "error": "the stream ended without text"}
    tokens = usage["completion_tokens"] if usage else chunks
    return {"ok": True, "ttft": first - sent, "end": last, "tokens": tokens,
            "tpot": (last - first) / (tokens - 1) if tokens > 1 else None}


async def _run(url: str, workload: list[dict], model: str | None, ignore_eos: bool, timeout: float) -> dict:
    limits = httpx.Limits(max_connections=len(workload), max_keepalive_connections=len(workload))
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        if model is None:
            try:
                r = await http.get(url + "/v1/models")
                r.raise_for_status()
                model = r.json()["data"][0]["id"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                raise InferlabError(f"cannot list the models of {url} ({type(exc).__name__}: {exc}): "
                                    f"is an OpenAI-compatible server running there? Or pass --model NAME") from None
        start = time.perf_counter()
        results = await asyncio.gather(*[_one(http, url, model, req, start, ignore_eos) for req in workload])
    ok = [r for r in results if r["ok"]]
    end = max((r["end"] for r in ok), default=start)
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["ttft"] for r in ok]
    tpot = [r["tpot"] for r in ok if r["tpot"] is not None]
    errors = [r["error"] for r in results if not r["ok"]]
    return {"url": url, "model": model, "requests": len(workload), "completed": len(ok),
            "output_tokens": tokens, "duration_s": end - start,
            "tokens_per_s": tokens / (end - start) if end > start else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
            "first_error": errors[0] if errors else None}


def run_client(url: str, workload: list[dict], model: str | None = None, ignore_eos: bool = True,
               timeout: float = 600.0) -> dict:
    """Send ``workload`` ([{"prompt", "max_tokens", "arrival_s"}]) to the server at ``url``
    (``http://HOST:PORT``) and return the client-side measurements. ``model``: the served name
    (default: the first one ``/v1/models`` lists)."""
    return asyncio.run(_run(url.rstrip("/").removesuffix("/v1"), workload, model, ignore_eos, timeout))
