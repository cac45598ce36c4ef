"""The environment variables that choose the decode loops, read in one place.

``INFERLAB_QUANT_KERNEL`` (``auto``: the hand loops where they run; ``compiled`` or ``eager``: torch
only), ``ATEN_CPU_CAPABILITY`` (``default`` turns the loops off; ``avx2`` runs the AVX2 builds) and
``INFERLAB_VNNI_BUILD`` (``native``, ``avx2`` or ``portable``). A decode step asks for them at every
projection, norm and attention call, several hundred times a token, and each ``os.environ`` read
costs about a microsecond: so a model's forward holds one reading for its whole pass (:func:`held`),
and a call outside a forward reads the environment afresh (a test's ``monkeypatch.setenv`` holds at once).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, NamedTuple


class Settings(NamedTuple):
    """The environment variables that choose the decode loops, read together."""

    kernel: str      #: INFERLAB_QUANT_KERNEL: ``auto`` (the loops), ``compiled`` or ``eager`` (torch only)
    capability: str  #: ATEN_CPU_CAPABILITY, lower case ('' when unset): ``default`` turns the loops off
    build: str       #: INFERLAB_VNNI_BUILD: ``native``, ``avx2`` or ``portable``


def _read() -> Settings:
    env = os.environ
    return Settings(env.get("INFERLAB_QUANT_KERNEL", "auto").lower(), env.get("ATEN_CPU_CAPABILITY", "").lower(),
                    env.get("INFERLAB_VNNI_BUILD", "native").lower())


_held: Settings | None = None


def settings() -> Settings:
    """The loop settings in force: the reading held by the running forward, else the environment's now."""
    return _held if _held is not None else _read()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Read the settings once and keep them until the block ends (a model's forward pass; a forward
    nested in another, a draft's inside its target's step, keeps the outer reading)."""
    global _held
    if _held is not None:
        yield
        return
    _held = _read()
    try:
        yield
    finally:
        _held = None


def constant_in_graphs(fn):
    """Mark ``fn`` as ``torch.compiler.assume_constant_result`` does: a compiled graph calls it
    once, while tracing, and keeps its answer (which loop runs here) as a constant. That function
    only sets this mark, but it imports ``torch._dynamo`` to do so, a second of every process's
    start (the CLI's, a notebook kernel's) that most never compile anything.
    tests/kernels/test_loop_settings.py checks that torch still marks a function this way."""
    fn._dynamo_marked_constant = True
    return fn
