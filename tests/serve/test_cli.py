"""``inferlab serve`` as a user runs it: a subprocess on a free loopback port, stopped with Ctrl-C."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from inferlab.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_inferlab_serve_command():
    from openai import OpenAI

    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERLAB_API_KEY": "sk-cli"}
    proc = subprocess.Popen([sys.executable, "-m", "inferlab", "serve", "--model", "draft", "--device", "cpu",
                             "--port", str(port), "--max-num-seqs", "4", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up in 60 s"
            time.sleep(0.2)
        assert httpx.get(url + "/v1/models").status_code == 401  # the key from INFERLAB_API_KEY
        client = OpenAI(base_url=url + "/v1", api_key="sk-cli", max_retries=0)
        r = client.completions.create(model="draft", prompt="def f(x):", max_tokens=5, temperature=0)
        assert r.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "Traceback" not in out


def test_bad_port_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--port", "70000"])
    assert exit_.value.code == 2 and "--port must be in 0..65535" in capsys.readouterr().err


def test_api_key_from_the_environment_and_limit_flags(monkeypatch):
    from inferlab.serve import limits_from_args, parser

    monkeypatch.setenv("INFERLAB_API_KEY", "sk-env")
    limits = limits_from_args(parser().parse_args(["--max-prompts", "5", "--max-waiting-requests", "9"]))
    assert limits.api_key == "sk-env" and limits.max_prompts == 5 and limits.max_waiting_requests == 9
    assert limits_from_args(parser().parse_args(["--api-key", "sk-flag"])).api_key == "sk-flag"
    monkeypatch.setenv("INFERLAB_API_KEY", "")
    assert limits_from_args(parser().parse_args([])).api_key is None


@pytest.mark.parametrize("argv,message", [
    (["--max-stop", "0"], "--max-stop must be a positive integer, got 0"),
    (["--max-prompts", "300"], "--max-prompts (300) exceeds --max-waiting-requests (256)"),
    (["--api-key", ""], "the API key is empty"),
])
def test_bad_limits_are_one_line_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_quantization_reaches_the_served_model(monkeypatch):
    """`inferlab serve --quantization int8` serves the quantized model (the app is caught before it
    would listen, then run on a thread)."""
    from openai import OpenAI

    from inferlab.quant import QuantLinear
    from inferlab.serve import launcher

    apps = []
    monkeypatch.setattr(launcher, "serve", lambda app, *args: apps.append(app))
    assert main(["serve", "--model", "target", "--device", "cpu", "--max-num-seqs", "2", "--quantization", "int8"]) == 0
    (app,) = apps
    assert any(isinstance(m, QuantLinear) for m in app.state.engine.engine.model.modules())
    with launcher.ServerThread(app) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        r = client.completions.create(model="target", prompt="def f(x):", max_tokens=4, temperature=0)
        assert r.usage.completion_tokens == 4
