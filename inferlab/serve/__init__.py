"""``inferlab serve``: the engine behind an OpenAI-compatible HTTP API.

    async_engine.py  the engine loop on its own thread; per-request asyncio queues for streaming
    protocol.py      OpenAI's request/response bodies (pydantic)
    serving.py       /v1/completions and /v1/chat/completions: prompts in, JSON or SSE out
    chat.py          chat messages -> one prompt (the model's chat template or a plain default)
    metrics.py       /metrics in Prometheus format, under vLLM's metric names
    api_server.py    the FastAPI app: routes, OpenAI-style errors, client disconnects
    launcher.py      load a model and run the app (foreground, or a background thread)

``inferlab serve --model draft --port 8000``, then point any OpenAI client (or
``inferlab bench serve --url http://127.0.0.1:8000``) at it.
"""
from __future__ import annotations

import argparse

_PLAIN = "inferlab serve: an OpenAI-compatible HTTP server on the engine"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferlab serve", description=_PLAIN)
    p.add_argument("--model", default="target", help="embedded name, HF folder or hub id (default: target)")
    p.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument("--enable-chunked-prefill", action="store_true")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser().error(f"--port must be in 0..65535, got {args.port}")
    try:
        from inferlab.serve.launcher import make_app, serve
    except ImportError as exc:
        from inferlab.errors import InferlabError

        raise InferlabError(f"inferlab serve needs the serve extra ({exc.name} is missing): "
                            f"pip install 'inferlab[serve]'") from None

    app = make_app(args.model, args.served_model_name, device=args.device, dtype=args.dtype,
                   block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs,
                   max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                   enable_prefix_caching=args.enable_prefix_caching,
                   enable_chunked_prefill=args.enable_chunked_prefill)
    serve(app, args.host, args.port, args.log_level)
    return 0
