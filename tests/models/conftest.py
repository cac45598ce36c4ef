"""Shared helpers for the embedded-model tests."""
import json

import pytest

from inferlab import cli
from inferlab.model.loader import ASSETS


def run_cli(capsys, *argv) -> str:
    """Run ``inferlab ARGV`` in-process; return its stdout (asserts exit code 0)."""
    code = cli.main(list(argv))
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def run_json(capsys, *argv):
    return json.loads(run_cli(capsys, *argv).strip().splitlines()[-1])


@pytest.fixture(params=["target", "draft"])
def shipped(request):
    """The folder of one shipped model (skips when the pair has not been trained yet)."""
    folder = ASSETS / request.param
    if not (folder / "model.safetensors").exists():
        pytest.skip(f"embedded model {request.param!r} not built: run `inferlab train --budget 60`")
    return request.param, folder
