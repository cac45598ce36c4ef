"""Notebook 01's arithmetic: the schemes the error explorer offers (its widget is
:mod:`inferlab.viz.quant_explorer`) and a Q4_K super-block, byte by byte."""
from __future__ import annotations

import torch

from inferlab.quant import ggml
from inferlab.quant.int4 import dequantize_int4, quantize_int4
from inferlab.quant.int8 import quantize_int8
from inferlab.quant.nf4 import dequantize_nf4, quantize_nf4

SCHEMES = {"int8 per-channel": (8, None), "int4 g32": (4, 32), "int4 g64": (4, 64), "int4 g128": (4, 128),
           "int4 per-row": (4, -1), "int3 g128": (3, 128), "int2 g64": (2, 64), "nf4 (block 64)": ("nf4", 64)}


def roundtrip(w: torch.Tensor, bits, group: int | None) -> tuple[torch.Tensor, float]:
    """Quantize and dequantize ``w`` with one scheme; returns (w~, bits per weight as stored)."""
    out, cols = w.shape
    if bits == 8:
        q, s = quantize_int8(w)
        return q.float() * s.float()[:, None], 8 + 16 / cols
    if bits == "nf4":
        packed, absmax = quantize_nf4(w, group)
        return dequantize_nf4(packed, absmax, w.shape, group), 4 + 32 / group
    group = cols if group == -1 else group
    qw, s, z = quantize_int4(w, group, bits)
    # 4-bit slots (int3 and int2 codes too: they do not split evenly into bytes) + fp16 scale and
    # uint8 zero point per group
    return dequantize_int4(qw, s, z, group), 4 + 24 / group


def describe_q4_k(block: torch.Tensor) -> str:
    """What one Q4_K super-block's 144 bytes hold, as text."""
    assert block.numel() == 144, "one super-block is 144 bytes"
    b = block.to(torch.uint8)
    d, dmin = ggml._f16(b[0:2][None]).item(), ggml._f16(b[2:4][None]).item()
    sc, mn = ggml.q4_k_scales_mins(b[4:16][None])
    hexs = lambda t: " ".join(f"{v:02x}" for v in t.tolist())  # noqa: E731
    lines = [f"bytes   0-1   d    (fp16) = {d:.6g}      [{hexs(b[0:2])}]",
             f"bytes   2-3   dmin (fp16) = {dmin:.6g}      [{hexs(b[2:4])}]",
             f"bytes   4-15  8 six-bit scales and 8 six-bit mins, packed   [{hexs(b[4:16])}]"]
    for j in range(8):
        lines.append(f"              sub-block {j}: scale {int(sc[0, j]):2d} x d = {d * int(sc[0, j]):.5f}   "
                     f"min {int(mn[0, j]):2d} x dmin = {dmin * int(mn[0, j]):.5f}")
    lines.append("bytes  16-143 256 four-bit codes: 32 bytes per pair of sub-blocks (low nibbles: the even one)")
    lines.append(f"              first 8 bytes: [{hexs(b[16:24])}]")
    lines.append("value = d*scale_j * q - dmin*min_j   ->   144 bytes * 8 / 256 values = 4.5 bits per weight")
    return "\n".join(lines)
