"""The float32 decode product: a few rows times an unquantized weight, reading the weight once
(``f32.c``, beside this file: why, and the three builds).

:func:`linear` returns ``x @ w.T (+ b)`` from the hand loop where it runs (a CPU, any number of
rows, shapes the vector width divides), else None and the caller runs
``F.linear``. It picks the build for the CPU: AVX-512, AVX2 + FMA (also on an AVX-512 CPU when
``ATEN_CPU_CAPABILITY=avx2`` asks torch to behave as on an AVX2 one), or NEON. It steps aside when
``INFERLAB_QUANT_KERNEL`` is ``compiled`` or ``eager`` (then every product is torch's) and when no
compiler is found. Inside a compiled step the loop is the op ``inferlab::f32_gemv``.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from pathlib import Path
from typing import NamedTuple

import torch

from inferlab.loop_settings import constant_in_graphs, settings
from inferlab.quant import fused

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("f32.c")


class Loop(NamedTuple):
    isa: str          # avx512, avx2 or neon
    width: int        # floats per vector: K must be a multiple
    function: object  # the ctypes function


@functools.cache
def _loop(capability: str) -> Loop | None:
    """The build of the loop for this CPU (and ``ATEN_CPU_CAPABILITY``), or None where none runs."""
    if capability == "default" or not fused.compiler_available():
        return None
    from inferlab.quant.vnni import _build

    try:
        lib = ctypes.CDLL(str(_build(SOURCE)))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("inferlab: the float32 decode loop did not build (%s); float linears use torch", e)
        return None
    isa = {2: "avx512", 1: "avx2", 3: "neon"}.get(lib.inferlab_f32_isa())
    if isa == "avx512" and capability == "avx2":
        isa = "avx2"  # the process asked torch for AVX2 kernels: run as an AVX2 CPU would
    if isa is None:
        return None
    function = getattr(lib, f"inferlab_f32_gemv_{isa}")
    # declared once, so a call passes plain ints (a decode step makes ~120 of these calls)
    function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_int]
    return Loop(isa, {"avx512": 8, "avx2": 8, "neon": 4}[isa], function)  # x86: 8-float vectors in both


def loop() -> Loop | None:
    """The loop that runs here now (None: torch's F.linear does every product)."""
    now = settings()
    if now.kernel != "auto":
        return None
    return _loop(now.capability)


_loop_now = constant_in_graphs(loop)


def _gemv(found: Loop, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] (contiguous, read in place as [rows, K]) @ weight^T -> [..., N]."""
    K = x.shape[-1]
    y = torch.empty((*x.shape[:-1], weight.shape[0]))
    found.function(x.data_ptr(), x.numel() // K, K, weight.data_ptr(), weight.shape[0], y.data_ptr(),
                   torch.get_num_threads())
    return y


def f32_gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T, both contiguous float32 on the CPU, through the loop."""
    return _gemv(_loop_now(), x, weight)


_OP = torch.library.custom_op("inferlab::f32_gemv", f32_gemv, mutates_args=())
_OP.register_fake(lambda x, weight: x.new_empty(x.shape[0], weight.shape[0]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` through the loop, or None where the loop does not take it."""
    K = x.shape[-1]
    rows = fused.activation_rows(x)
    if not (rows > 0 and x.dtype is torch.float32 and weight.dtype is torch.float32
            and x.is_cpu and weight.is_cpu and weight.shape[0] % 4 == 0
            and weight.is_contiguous() and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        return None
    found = _loop_now()
    if found is None or K % found.width:
        return None
    if torch.compiler.is_compiling():
        y = _OP(x.reshape(rows, K).contiguous(), weight).view(*x.shape[:-1], weight.shape[0])
    else:
        y = _gemv(found, x if x.is_contiguous() else x.contiguous(), weight)
    return y if bias is None else y + bias
