"""Fixtures of the JupyterLab browser tests (the helpers are in lab.py): Chromium's path and
`make lab`'s server, one per test module."""
from __future__ import annotations

import pytest

from .lab import chromium_path, serve_jupyterlab


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_path()


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """(url, workspace) of `make lab`'s JupyterLab on a loopback port, serving a fresh workspace."""
    yield from serve_jupyterlab(tmp_path_factory.mktemp("jupyterlab"))
