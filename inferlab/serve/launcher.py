"""Build the server from command-line style knobs, and run it in the foreground or on a thread.

``inferlab serve`` runs ``serve(...)`` in the foreground. ``ServerThread`` runs the same app on a
background thread of this process (a notebook, a test, a benchmark's self-check):

    with ServerThread(make_app("draft", max_num_seqs=8)) as server:
        OpenAI(base_url=server.url + "/v1", api_key="none").completions.create(...)
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time

import uvicorn

from inferlab.serve.api_server import build_app
from inferlab.serve.limits import ServerLimits

log = logging.getLogger("inferlab.serve")


def make_app(model: str = "target", served_model_name: str | None = None, limits: ServerLimits | None = None,
             **llm_kwargs):
    """Load ``model`` into an ``LLM`` (``llm_kwargs``: device, dtype and the engine's knobs) and
    return the ASGI app that serves it, refusing what ``limits`` caps."""
    from inferlab.llm import LLM
    from inferlab.model.loader import resolve_model_path

    llm = LLM(model=model, **llm_kwargs)
    folder = resolve_model_path(model)
    return build_app(llm.llm_engine, llm.tokenizer, served_model_name or str(model), root=str(folder),
                     limits=limits)


def serve(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    if not _is_loopback(host) and app.state.serving.limits.api_key is None:
        log.warning("listening on %s: anyone who reaches this address can use the model (no API key is checked: "
                    "pass --api-key or set INFERLAB_API_KEY)", host)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class ServerThread:
    """The app on a uvicorn server in a daemon thread, bound to a free loopback port."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.app = app
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="inferlab-server", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start: see the log above")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
