"""The small operations of a decode step in one C call each (``glue.c``, beside this file: why).

:func:`rms_norm` and :func:`rope_` run RMSNorm and the rotary embedding of a layer as llama.cpp
runs them, one loop each, where the torch ops would spend most of a decode step's non-weight time
dispatching. Each returns None (or False) where the C build does not take the call, and the caller
runs the torch reference: a tensor that is not float32 on the CPU, autograd, a compiled step
(inductor fuses these ops itself), ``INFERLAB_QUANT_KERNEL`` set to ``compiled`` or ``eager``
(every op is torch's, as for the linears), ``ATEN_CPU_CAPABILITY=default``, or no C compiler.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from inferlab.native import library, runs

SOURCE = Path(__file__).with_name("glue.c")
DEPENDS = (Path(__file__).parent.parent / "clones.h", Path(__file__).parent.parent / "exp_poly.h")  # what glue.c includes
_p, _i, _i64, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_SIGNATURES = (("inferlab_rms_norm", (_p, _p, _p, _i, _i, _f, _i)),
               ("inferlab_rope", (_p, _i, _i, _i, _i64, _i64, _p, _p)),
               ("inferlab_silu_mul", (_p, _i64, _p, _i64, _p, _i, _i, _i)),
               ("inferlab_argmax", (_p, _i, _i64, _p, _i)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """x / rms(x) * weight over the last dimension, or None where the C loop does not run."""
    if not (runs(x, weight) and x.is_contiguous() and weight.is_contiguous()) \
            or (lib := library(SOURCE, _SIGNATURES, DEPENDS)) is None:
        return None
    out = torch.empty_like(x)
    dim = x.shape[-1]
    lib.inferlab_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, eps,
                          torch.get_num_threads())
    return out


def rope_(cos: torch.Tensor, sin: torch.Tensor, *xs: torch.Tensor) -> bool:
    """Rotate each x [1, H, T, D] in place by cos/sin [1, 1, T, D] (what ``rope.apply_rope``
    returns); an x may be a strided view, as the q and k parts of a packed projection are. False,
    and nothing rotated, where the C loop does not take them all (the caller runs ``apply_rope``)."""
    if not (cos.shape[0] == 1 and cos.is_contiguous() and sin.is_contiguous() and runs(cos, sin, *xs)
            and all(x.dim() == 4 and x.shape[0] == 1 and x.stride(-1) == 1 for x in xs)) \
            or (lib := library(SOURCE, _SIGNATURES, DEPENDS)) is None:
        return False
    for x in xs:
        _, heads, tokens, d = x.shape
        lib.inferlab_rope(x.data_ptr(), tokens, heads, d, x.stride(2), x.stride(1), cos.data_ptr(), sin.data_ptr())
    return True


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up, SwiGLU's gate, in one loop instead of three torch ops; None where the C loop
    does not run. gate and up [..., F] may be the two halves of a packed output (strided rows). A
    prompt's rows take the same loop (on torch's threads): a decode row's value is then the same
    whether its step runs the C layers or, beside a prompt's chunk, the modules."""
    f = gate.shape[-1] if gate.dim() else 0
    if not (runs(gate, up) and gate.shape == up.shape and gate.numel() > 0) \
            or (lib := library(SOURCE, _SIGNATURES, DEPENDS)) is None:
        return None
    g, u = gate.reshape(-1, f), up.reshape(-1, f)  # views where the rows are evenly strided
    if g.stride(-1) != 1 or u.stride(-1) != 1:
        return None
    out = torch.empty(gate.shape)
    lib.inferlab_silu_mul(g.data_ptr(), g.stride(0), u.data_ptr(), u.stride(0), out.data_ptr(), g.shape[0], f,
                          torch.get_num_threads())
    return out


def argmax(x: torch.Tensor) -> torch.Tensor | None:
    """The position of the first maximum along the last dimension of x [..., V] (int64, torch's
    ``x.max(-1).indices``: the first of equal maxima, a row's first NaN if it holds one), or None
    where the C loop does not run."""
    if not (runs(x) and x.dim() >= 1 and x.shape[-1] > 0 and x.is_contiguous()) \
            or (lib := library(SOURCE, _SIGNATURES, DEPENDS)) is None:
        return None
    n = x.shape[-1]
    out = torch.empty(x.shape[:-1], dtype=torch.int64)
    lib.inferlab_argmax(x.data_ptr(), x.numel() // n, n, out.data_ptr(), torch.get_num_threads())
    return out
