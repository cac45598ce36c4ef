"""Dequantize inside the reduction: quantized matrix-vector products that read only the packed codes.

Decoding one token multiplies a vector by every weight matrix: its time is the time to read the
weights. Dequantize-then-matmul (``QuantLinear.dequantize`` + ``F.linear``, the readable reference)
reads the small codes, *writes* an fp32 weight 4-8x larger, then reads it again: slower than fp32.
Here each format's product is written as one expression, ``y[m, n] = sum_k x[m, k] * w(codes)[n, k]``,
whose decoding of ``w`` sits inside the sum. ``torch.compile`` (inductor) fuses the expression into
one vectorised C++ loop per weight (or one Triton kernel on a GPU), so the loop reads each packed
byte once and never stores a dequantized weight (gpt-fast's int8 path is the same idea).

Group-wise formats use the distributive law to take the zero point out of the inner loop:
``sum_k (q_k - z) s x_k = s (sum_k q_k x_k - z sum_k x_k)``.

Where compiling is impossible (no C++ compiler, an unsupported platform), :func:`fused_call` says
so once and returns None; the caller then uses the reference. ``INFERLAB_QUANT_KERNEL=eager``
forces the reference everywhere (to compare, or to debug). On x86 CPUs with AVX-512 VNNI, decode
runs ``inferlab.quant.vnni``'s hand-written loops instead (faster: see there).
"""
from __future__ import annotations

import functools
import logging
import os
import shutil

import torch

from inferlab.loop_settings import settings

log = logging.getLogger(__name__)
#: The most activation rows the compiled products (and W8A8) take: decode. Above this (prefill,
#: perplexity, large batches) the reference runs, its one dequantization shared by many rows, so
#: quality numbers measured on prompts are the reference's.
MAX_COMPILED_ROWS = 4
_broken: list[str] = []  # the fast paths found not to work here ("compile", "w8a8"): warned once


def activation_rows(x: torch.Tensor) -> int:
    """The activation rows a call handles: x [..., K] seen as [rows, K] (0 for an empty x)."""
    return x.numel() // x.shape[-1] if x.numel() else 0


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] float, q [N, K] int8, scales [N] -> [M, N]: (sum_k x_k q_nk) * s_n.

    The sum is split in chunks of up to 256 (partial sums, then their sum): inductor then keeps
    several independent accumulators instead of one long dependency chain."""
    M, K = x.shape
    c = next(c for c in (256, 128, 64, 32, K) if K % c == 0)
    part = (x.view(M, 1, K // c, c) * q.view(1, -1, K // c, c).float()).sum(-1)
    return part.sum(-1) * scales.float()


def int8_w8a8(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] float, q [N, K] int8 -> [M, N] with the activations quantized too (W8A8, dynamic).

    Each row of x gets its own absmax scale, ``x ~ xs * xq`` with xq in -127..127; then
    ``torch._int_mm`` multiplies int8 by int8 into int32 (oneDNN: VNNI's 4-way int8 dot products
    on CPUs that have them) and one multiply by ``xs * s_n`` restores the scale. llama.cpp does
    the same for Q8_0 (it quantizes activations to 8 bits before its dot products). The result
    differs from the reference by at most ``sum_k |w_nk| * xs / 2`` (the activations' rounding).
    Runs eagerly: no compiler needed (the same ops compiled as one inductor graph measured ~10%
    slower per decoded token here: the int8 GEMM stays a library call either way)."""
    xs = x.abs().amax(-1, keepdim=True).clamp_(min=1e-30).div_(127)
    xq = x.div(xs).round_().to(torch.int8)
    return torch._int_mm(xq, q.t()).float().mul_(xs).mul_(scales)  # few ops: each costs ~10 us here


def w8a8_call(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, max_rows: int = MAX_COMPILED_ROWS):
    """:func:`int8_w8a8` on up to ``max_rows`` rows of a CPU tensor; None where the reference should run."""
    rows = activation_rows(x)
    if rows == 0 or rows > max_rows or x.is_cuda or mode() == "eager" or "w8a8" in _broken:
        return None
    try:
        y = int8_w8a8(x.reshape(rows, x.shape[-1]).float(), q, scales)
    except RuntimeError as e:  # a torch build without the CPU int8 GEMM
        _broken.append("w8a8")
        log.warning("inferlab: int8 linears fall back to dequantize-then-matmul: %s", str(e).splitlines()[0][:200])
        return None
    return y.to(x.dtype).view(*x.shape[:-1], y.shape[-1])


def deinterleave(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (even columns, odd columns), each contiguous [M, K // 2]: two codes share a byte,
    and contiguous activations let the compiled loop load 16 of them at once."""
    pairs = x.view(x.shape[0], -1, 2)
    return pairs[..., 0].contiguous(), pairs[..., 1].contiguous()


_NIBBLE_SCALE = torch.tensor([16.0 ** -i for i in range(7)] + [1.0])  # exact powers of two


def nibble_planes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (planes [M, 8, K // 8], x): plane i holds columns i, i + 8, ... times 16^-i
    (plane 7 unscaled), the layout :func:`int4_matmul` multiplies the nibbles of int32 words with."""
    M, K = x.shape
    planes = (x.view(M, K // 8, 8) * _NIBBLE_SCALE.to(x.device)).transpose(1, 2).contiguous()
    return planes, x


def int4_matmul(planes: torch.Tensor, x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """Group-wise 4-bit (``inferlab.quant.int4`` layout), qweight read as int32 ``words`` [N, K // 8]
    and x given as :func:`nibble_planes` -> [M, N].

    Little endian, word w of a row holds columns 8w .. 8w + 7, nibble i (bits 4i..4i+3) = column
    8w + i. A 16-lane vector load takes 128 weights, a whole group of 128. Nibble i is read *in
    place*: ``(w & 15 << 4i)`` as a float is exactly ``q * 16^i`` (4 significant bits), and the
    plane is pre-scaled by 16^-i, so each nibble costs an AND, a convert and a multiply-add, no
    shift (the top nibble, whose bit 31 is the sign, is shifted down instead). The group's scale
    multiplies the partial sums lane-wise, so a row needs one horizontal sum, not one per group.
    The zero point leaves the loop: ``sum_k (q_k - z) s x_k = s sum_k q_k x_k - z s sum_k x_k``."""
    M = x.shape[0]
    N, W = words.shape
    G = W * 8 // group_size
    w = words.view(1, N, G, W // G)
    acc = ((w >> 28) & 15).float() * planes[:, 7].reshape(M, 1, G, -1)
    for i in range(7):
        acc = acc + (w & (15 << 4 * i)).float() * planes[:, i].reshape(M, 1, G, -1)
    s = scales.float()
    xsum = x.view(M, 1, G, group_size).sum(-1)
    return (acc * s.view(1, N, G, 1)).sum((-1, -2)) - (zeros.float() * s * xsum).sum(-1)


def nf4_matmul(xe: torch.Tensor, xo: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor,
               code: torch.Tensor, blocksize: int) -> torch.Tensor:
    """NF4 (bitsandbytes layout: high nibble = even element, blocks of ``blocksize`` along each
    row), x given as :func:`deinterleave` pairs -> [M, N]. The 16 code values are a table lookup."""
    M, H = xe.shape
    B = 2 * H // blocksize
    q = qweight.view(1, -1, B, blocksize // 2)
    dot = (code[(q >> 4).int()] * xe.view(M, 1, B, -1) + code[(q & 15).int()] * xo.view(M, 1, B, -1)).sum(-1)
    return (dot * absmax.view(1, -1, B)).sum(-1)


PREPARE = {int4_matmul: nibble_planes, nf4_matmul: deinterleave}  # these take prepare(x) instead of x


def _f16(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Two uint8 byte tensors -> the float16 they spell (little endian), as float32."""
    return (lo.to(torch.int32) | (hi.to(torch.int32) << 8)).to(torch.int16).view(torch.float16).float()


def q8_0_matmul(x: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """llama.cpp Q8_0 blocks (fp16 d, 32 int8) -> [M, N]."""
    M, K = x.shape
    b = qweight.view(1, -1, K // 32, 34)
    d = _f16(b[..., 0], b[..., 1])
    q = b[..., 2:].view(torch.int8).float()
    return ((q * x.view(M, 1, K // 32, 32)).sum(-1) * d).sum(-1)


def q4_0_matmul(x: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """llama.cpp Q4_0 blocks (fp16 d, 16 bytes: value i low nibble, i + 16 high) -> [M, N]."""
    M, K = x.shape
    b = qweight.view(1, -1, K // 32, 18)
    d = _f16(b[..., 0], b[..., 1])
    qs = b[..., 2:]
    xb = x.view(M, 1, K // 32, 2, 16)
    dot = ((qs & 15).float() * xb[..., 0, :] + (qs >> 4).float() * xb[..., 1, :]).sum(-1)
    return ((dot - 8 * xb.sum((-1, -2))) * d).sum(-1)


def q4_1_matmul(x: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """llama.cpp Q4_1 blocks (fp16 d, fp16 m, Q4_0's 16 bytes of nibbles), w = d * q + m -> [M, N].

    The min leaves the inner sum: sum_k (d q_k + m) x_k = d sum_k q_k x_k + m sum_k x_k."""
    M, K = x.shape
    b = qweight.view(1, -1, K // 32, 20)
    d, m = _f16(b[..., 0], b[..., 1]), _f16(b[..., 2], b[..., 3])
    qs = b[..., 4:]
    xb = x.view(M, 1, K // 32, 2, 16)
    dot = ((qs & 15).float() * xb[..., 0, :] + (qs >> 4).float() * xb[..., 1, :]).sum(-1)
    return (dot * d + xb.sum((-1, -2)) * m).sum(-1)


def q4_k_matmul(x: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """llama.cpp Q4_K super-blocks of 256 (see ``inferlab.quant.ggml``) -> [M, N].

    Sub-block j of 32 has w = d*sc_j * q - dmin*m_j; byte c of the 32-byte chunk i holds
    sub-block 2i (low nibble) and 2i + 1 (high nibble)."""
    M, K = x.shape
    S = K // 256
    b = qweight.view(1, -1, S, 144)
    d, dmin = _f16(b[..., 0], b[..., 1]), _f16(b[..., 2], b[..., 3])
    sc, mn = b[..., 4:8], b[..., 8:12]
    md = b[..., 12:16]
    scales = torch.cat([sc & 0x3F, (md & 0x0F) | ((sc >> 2) & 0x30)], -1).float() * d[..., None]  # [1, N, S, 8]
    mins = torch.cat([mn & 0x3F, (md >> 4) | ((mn >> 2) & 0x30)], -1).float() * dmin[..., None]
    qs = b[..., 16:].view(1, -1, S, 4, 32)
    xs = x.view(M, 1, S, 4, 2, 32)
    lo = ((qs & 15).float() * xs[..., 0, :]).sum(-1)  # [M, N, S, 4]: sub-blocks 0, 2, 4, 6
    hi = ((qs >> 4).float() * xs[..., 1, :]).sum(-1)  # sub-blocks 1, 3, 5, 7
    dot = torch.stack([lo, hi], -1).flatten(-2)  # [M, N, S, 8]
    xsum = x.view(M, 1, S, 8, 32).sum(-1)
    return (dot * scales - xsum * mins).sum((-1, -2))


@functools.cache
def compiler_available() -> bool:
    return any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "g++", "clang++"))


_KERNELS: dict = {}  # (function, argument shapes and values) -> its compiled kernel


def _compiled(fn, args):
    """The kernel inductor generates for ``fn`` at these argument shapes (one per weight shape and
    row count: a model has a handful). ``torch._inductor.standalone_compile`` on the traced graph is
    called without dynamo's guards, about 100 us less per call than ``torch.compile``'s wrapper, which
    matters when a linear's work is tens of microseconds; where it is missing, ``torch.compile``."""
    key = (fn,) + tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
    kernel = _KERNELS.get(key)
    if kernel is None:
        from torch import _inductor as inductor  # here: a platform without inductor still loads inferlab.quant
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        consts = {i: a for i, a in enumerate(args) if i not in tensors}

        def traced(*ts):
            full = list(consts.get(i) for i in range(len(args)))
            for i, t in zip(tensors, ts):
                full[i] = t
            return fn(*full)
        example = [args[i] for i in tensors]
        if hasattr(inductor, "standalone_compile"):
            from torch.fx.experimental.proxy_tensor import make_fx
            with inductor.config.patch(realize_opcount_threshold=200):  # keep int4's 8 nibbles in one loop
                artifact = inductor.standalone_compile(make_fx(traced)(*example), example,
                                                       dynamic_shapes="from_example_inputs")

            def kernel(*ts):
                out = artifact(*ts)
                return out[0] if isinstance(out, (list, tuple)) else out
        else:
            kernel = torch.compile(traced, dynamic=False, fullgraph=True)
        _KERNELS[key] = kernel = (kernel, tensors)
    fn_compiled, tensors = kernel
    return fn_compiled(*(args[i] for i in tensors))


def mode() -> str:
    """``INFERLAB_QUANT_KERNEL``: ``auto`` (the default: ``inferlab.quant.vnni``'s kernels where the
    CPU has AVX-512 VNNI, else these compiled products), ``compiled`` (these only) or ``eager``
    (the dequantize-then-matmul reference everywhere); read through ``inferlab.loop_settings``."""
    return settings().kernel


def _give_up(why: str) -> None:
    if "compile" not in _broken:
        _broken.append("compile")
        log.warning("inferlab: quantized linears fall back to dequantize-then-matmul (slower): %s", why)


def fused_call(fn, x: torch.Tensor, *args):
    """``fn(x2d, *args)`` compiled, for a batch of at most MAX_COMPILED_ROWS rows; None where the
    reference should run. Inside a compiled decode step the expression itself joins that step's graph."""
    rows = activation_rows(x)
    compiling = torch.compiler.is_compiling()
    if not 0 < rows <= MAX_COMPILED_ROWS:
        return None
    if not compiling:
        if "compile" in _broken or mode() == "eager" or torch.is_grad_enabled() and x.requires_grad:
            return None
        if x.device.type == "cpu" and not compiler_available():
            _give_up("no C++ compiler found for torch.compile (install g++ or clang++ for the fast path)")
            return None
    x2 = x.reshape(rows, x.shape[-1]).float()
    full = (*(PREPARE[fn](x2) if fn in PREPARE else (x2,)), *args)
    if compiling:
        y = fn(*full)
    else:
        try:
            y = _compiled(fn, full)
        except Exception as e:  # noqa: BLE001  a compiler that fails is reported once, then avoided
            _give_up(f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
            return None
    return y.to(x.dtype).view(*x.shape[:-1], y.shape[-1])
