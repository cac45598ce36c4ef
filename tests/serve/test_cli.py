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
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
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
