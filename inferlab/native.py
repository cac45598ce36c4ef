"""The project's small C loops outside the quantized linears: how each is built, loaded and gated.

:func:`library` compiles a C file with the system compiler (``inferlab.quant.vnni._build``: once
per source and machine, in the cache) and declares its functions; :func:`runs` says whether a C
call may take a tensor now, so every loop steps aside at the same places as the linears' loops;
:func:`loops_run` whether this process runs them at all (what a notebook's claims that rest on
them check first).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from pathlib import Path

import torch

from inferlab.loop_settings import settings

log = logging.getLogger(__name__)


@functools.cache
def library(source: Path, signatures: tuple, depends: tuple[Path, ...] = ()) -> ctypes.CDLL | None:
    """``source`` compiled and loaded, its functions declared (``signatures``: (name, argtypes)
    pairs), or None where no compiler builds it. ``depends``: the files it includes (a change to
    one rebuilds it)."""
    from inferlab.quant import fused  # here, not above: inferlab.quant imports the model, which imports this
    from inferlab.quant.vnni import _build
    if not fused.compiler_available():
        return None
    try:
        lib = ctypes.CDLL(str(_build(source, (), depends)))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("inferlab: %s did not build (%s); torch runs its operations", source.name, e)
        return None
    for name, argtypes in signatures:
        getattr(lib, name).argtypes = list(argtypes)
    return lib


def runs(*tensors: torch.Tensor) -> bool:
    """Whether a C call may take these tensors now (float32 on the CPU, no autograd, eager)."""
    if torch.compiler.is_compiling():  # first: a compiled step never reads the environment here
        return False
    now = settings()
    if now.kernel != "auto" or now.capability == "default":
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return all(t.dtype is torch.float32 and t.is_cpu for t in tensors)


def loops_run() -> bool:
    """Whether the engine's C loops run in this process: a compiler builds them and the loop settings
    let them (not under ``ATEN_CPU_CAPABILITY=default`` or ``INFERLAB_QUANT_KERNEL``)."""
    from inferlab.quant import fused  # here, not above: see library()
    return runs(torch.zeros(1)) and fused.compiler_available()
