"""``inferlab serve``: the engine behind an OpenAI-compatible HTTP API.

    async_engine.py  the engine loop on its own thread; requests queued all together, or refused (429)
    streams.py       outputs on their way out: one-slot request streams, their merge, SSE
    protocol.py      OpenAI's request/response bodies (pydantic)
    serving.py       /v1/completions and /v1/chat/completions: prompts in, JSON or SSE out
    chat.py          where inferlab.model.chat used to live (chat templates belong to the model's tokenizer)
    metrics.py       /metrics in Prometheus format, under vLLM's metric names
    limits.py        what is refused before any work: size caps, the API key, a full queue (429)
    api_server.py    the FastAPI app: routes, OpenAI-style errors, client disconnects
    launcher.py      load a model and run the app (foreground, or a background thread)

``inferlab serve --model draft --port 8000``, then point any OpenAI client (or
``inferlab bench serve --url http://127.0.0.1:8000``) at it. ``--speculative-config '{"method":
"medusa", "num_speculative_tokens": 3}'`` speculates (vLLM's dict, as JSON); /metrics then counts
the guesses made and kept (``vllm:spec_decode_*``).
"""
from __future__ import annotations

import argparse
import json
import os
import re

from inferlab.serve.limits import ServerLimits

_PLAIN = "inferlab serve: an OpenAI-compatible HTTP server on the engine"


def parser() -> argparse.ArgumentParser:
    from inferlab.cli import add_quantization_argument

    p = argparse.ArgumentParser(prog="inferlab serve", description=_PLAIN)
    p.add_argument("--model", default="target", help="embedded name, HF folder or hub id (default: target)")
    p.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present, else cpu)")
    p.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (default: the device's usual one)")
    add_quantization_argument(p)
    p.add_argument("--block-size", type=int, default=16, help="KV cache slots per block (default: 16)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV blocks in the pool (default: max-num-seqs full contexts, capped by memory)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="sequences in the running batch (default: 64)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens computed per step (default: max(context, 2048); 512 with chunked prefill)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length, prompt + output (default: the model's)")
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="reuse the KV blocks of prompts that share a prefix (default: off)")
    p.add_argument("--enable-chunked-prefill", action="store_true",
                   help="split long prompts over several steps, mixed with decodes (default: off)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="speculative decoding, vLLM's dict as JSON, e.g. '{\"method\": \"medusa\", "
                        "\"num_speculative_tokens\": 3}' or '{\"model\": \"draft\", \"num_speculative_tokens\": 4}' "
                        "(default: none)")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                   help="the waiting queue's order: arrival, or each request's `priority` field (lower first; "
                        "the lowest is preempted first)")
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="most top tokens a request's logprobs / top_logprobs may ask for (default: 20, vLLM's)")
    p.add_argument("--logprobs-mode", default="raw_logprobs", choices=["raw_logprobs", "processed_logprobs"],
                   help="log-probs of the model's own distribution (default, vLLM's) or of the one sampled "
                        "from, after temperature, top-k and top-p")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="split the model over this many processes, gloo on CPU and NCCL on CUDA (default: 1)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default: info)")
    d = ServerLimits()
    g = p.add_argument_group("limits", "what the server refuses (400, or 429 when the queue is full)")
    g.add_argument("--api-key", default=os.environ.get("INFERLAB_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (/health and /metrics stay open; "
                        "default: $INFERLAB_API_KEY, else no key)")
    g.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help=f"largest request body (default: {d.max_body_bytes})")
    g.add_argument("--max-prompts", type=int, default=d.max_prompts,
                   help=f"prompts in one /v1/completions request (default: {d.max_prompts})")
    g.add_argument("--max-stop", type=int, default=d.max_stop,
                   help=f"stop strings, and stop_token_ids, per request (default: {d.max_stop})")
    g.add_argument("--max-stop-chars", type=int, default=d.max_stop_chars,
                   help=f"characters in one stop string (default: {d.max_stop_chars})")
    g.add_argument("--max-messages", type=int, default=d.max_messages,
                   help=f"messages in one chat request (default: {d.max_messages})")
    g.add_argument("--max-waiting-requests", type=int, default=d.max_waiting_requests,
                   help=f"requests queued before new ones get 429 (default: {d.max_waiting_requests})")
    return p


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The ``ServerLimits`` the command line asks for; a bad value is a one-line usage error."""
    try:
        return ServerLimits(max_body_bytes=args.max_body_bytes, max_prompts=args.max_prompts,
                            max_stop=args.max_stop, max_stop_chars=args.max_stop_chars,
                            max_messages=args.max_messages, max_waiting_requests=args.max_waiting_requests,
                            api_key=args.api_key)
    except ValueError as exc:
        parser().error(re.sub(r"\b(max_\w+|api_key)\b", lambda m: "--" + m[1].replace("_", "-"), str(exc)))


def parse_speculative_config(text: str | None) -> dict | None:
    """``--speculative-config``'s JSON, checked now: a bad one is a one-line usage error before
    any model loads."""
    if text is None:
        return None
    from inferlab.spec.config import SpeculativeConfig

    try:
        spec = json.loads(text)
        SpeculativeConfig.from_dict(spec)
    except json.JSONDecodeError as exc:
        parser().error(f"--speculative-config is not valid JSON ({exc.msg}): write it like "
                       "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'")
    except ValueError as exc:
        parser().error(f"--speculative-config: {exc}")
    return spec


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser().error(f"--port must be in 0..65535, got {args.port}")
    if args.max_logprobs < 0:
        parser().error(f"--max-logprobs must be >= 0, got {args.max_logprobs}")
    limits = limits_from_args(args)
    spec = parse_speculative_config(args.speculative_config)
    try:
        from inferlab.serve.launcher import make_app, serve
    except ImportError as exc:
        from inferlab.errors import InferlabError

        raise InferlabError(f"inferlab serve needs the serve extra ({exc.name} is missing): "
                            f"pip install 'inferlab[serve]'") from None

    app = make_app(args.model, args.served_model_name, limits, device=args.device, dtype=args.dtype,
                   quantization=args.quantization,
                   block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs,
                   max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                   enable_prefix_caching=args.enable_prefix_caching,
                   enable_chunked_prefill=args.enable_chunked_prefill, speculative_config=spec,
                   scheduling_policy=args.scheduling_policy, tensor_parallel_size=args.tensor_parallel_size,
                   max_logprobs=args.max_logprobs, logprobs_mode=args.logprobs_mode)
    serve(app, args.host, args.port, args.log_level)
    return 0
