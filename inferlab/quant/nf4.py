"""NF4: 4-bit NormalFloat with per-block absmax (Dettmers et al. 2023, QLoRA).

Trained weights are roughly normal, so the 16 code values are placed at quantiles of N(0, 1)
(scaled to [-1, 1], with an exact 0) instead of evenly: each code is used about equally often.
A block of 64 consecutive weights (row-major) shares one absmax; a weight is stored as the index
of the nearest code value to ``w / absmax``.

The decode loops multiply the codes as int8 (round(127 * code), as llama.cpp's IQ4_NL stores its
non-linear 4-bit values) against int8 activations; dequantize-then-matmul stays the reference.

Layout (bitsandbytes' own, so its ``dequantize_4bit`` reads these bytes unchanged):
    qweight  uint8   [out * in // 2]   byte i = code[2i] << 4 | code[2i + 1]  (high nibble first)
    absmax   float32 [out * in // blocksize]
"""
from __future__ import annotations

import torch

from inferlab.quant import fused, vnni
from inferlab.quant.base import QuantizationError, QuantLinear
from inferlab.quant.int4 import tile_codes

# The NF4 code values published with QLoRA (and used by bitsandbytes).
NF4_CODE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0])


def nf4_table(code: torch.Tensor = NF4_CODE) -> torch.Tensor:
    """The code values as the decode loops multiply them (``inferlab/quant/vnni.c``): integers
    t = round(127 * code), stored as t + 128 (uint8, for vpdpbusd's unsigned side) four times, once
    per 128-bit lane as vpshufb reads them: 64 bytes. A weight moves by at most absmax / 254."""
    t = torch.round(code.float() * 127).clamp(-127, 127).to(torch.int16) + 128
    return t.to(torch.uint8).repeat(4)


NF4_TABLE = nf4_table()


def nf4_tiles(qweight: torch.Tensor, absmax: torch.Tensor, out_features: int, in_features: int,
              blocksize: int) -> torch.Tensor:
    """NF4 laid out for ``inferlab_nf4_tiles_gemv`` (vnni.c; N a multiple of 16, blocks of a multiple of
    32 dividing K): :data:`NF4_TABLE`, then INT4's tiles (``inferlab.quant.int4.tile_codes``, the
    nibbles swapped so that the low one is the even column) with each block's 16 absmax / 127 as
    float32 where INT4 keeps its scales and zero points."""
    t, groups = out_features // 16, in_features // blocksize
    q = qweight.view(out_features, in_features // 2)
    q = (q << 4) | (q >> 4)
    codes = tile_codes(q, blocksize)
    scale = (absmax.float() * (1 / 127)).reshape(t, 16, groups).transpose(1, 2).contiguous()
    body = torch.cat([codes, scale.view(torch.uint8).view(t, groups, 64)], dim=-1)
    return torch.cat([NF4_TABLE, body.reshape(-1)])


def quantize_nf4(w: torch.Tensor, blocksize: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """w (any shape, numel divisible by blocksize) -> (packed uint8 [numel // 2], absmax float32 [blocks])."""
    flat = w.detach().float().reshape(-1)
    if flat.numel() % blocksize:
        raise QuantizationError(f"NF4 block size {blocksize} does not divide the weight's {flat.numel()} values")
    blocks = flat.view(-1, blocksize)
    absmax = blocks.abs().amax(1)
    normed = blocks / absmax.clamp(min=1e-12)[:, None]
    code = NF4_CODE.to(w.device)
    mid = (code[1:] + code[:-1]) / 2  # nearest code value: count the midpoints below
    q = torch.bucketize(normed.reshape(-1), mid).to(torch.uint8)
    return (q[0::2] << 4) | q[1::2], absmax


def dequantize_nf4(packed: torch.Tensor, absmax: torch.Tensor, shape, blocksize: int = 64) -> torch.Tensor:
    q = torch.stack((packed >> 4, packed & 0x0F), dim=-1).reshape(-1).long()
    vals = NF4_CODE.to(packed.device)[q].view(-1, blocksize) * absmax.float()[:, None]
    return vals.view(shape)


class NF4Linear(QuantLinear):
    method, bits = "nf4", 4

    def __init__(self, in_features: int, out_features: int, bias: bool, blocksize: int = 64):
        super().__init__(in_features, out_features, bias)
        n = in_features * out_features
        if n % blocksize:
            raise QuantizationError(f"NF4 block size {blocksize} does not divide {out_features}x{in_features}")
        self.blocksize = blocksize
        self.register_buffer("qweight", torch.zeros(n // 2, dtype=torch.uint8))
        self.register_buffer("absmax", torch.ones(n // blocksize, dtype=torch.float32))

    @classmethod
    def from_float(cls, linear, blocksize: int = 64) -> "NF4Linear":
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, blocksize)
        mod.qweight, mod.absmax = quantize_nf4(linear.weight, blocksize)
        if linear.bias is not None:
            mod.bias.data = linear.bias.detach().float().clone()
        return mod.to(linear.weight.device)

    def dequantize(self) -> torch.Tensor:
        return dequantize_nf4(self.qweight, self.absmax, (self.out_features, self.in_features), self.blocksize)

    def fused(self):
        if self.in_features % self.blocksize:  # blocks that straddle rows: only the reference
            return None
        return fused.nf4_matmul, self.qweight, self.absmax, NF4_CODE.to(self.qweight.device), self.blocksize

    def kernel(self, x: torch.Tensor) -> torch.Tensor | None:
        """On a CPU, ``inferlab.quant.vnni``'s loop: the codes looked up as int8 (:func:`nf4_table`) and
        multiplied by int8 activations, over tiles of 16 outputs where that loop runs."""
        if not torch.compiler.is_compiling() and (tiles := self.tiles()) is not None:
            y = vnni.nf4_tiles_linear(x, tiles, self.out_features, self.blocksize)
            if y is not None:
                return y
        return vnni.nf4_linear(x, self.qweight, self.absmax, NF4_TABLE, self.blocksize)

    def tiles(self) -> torch.Tensor | None:
        """The codes and absmax in tiles of 16 outputs (:func:`nf4_tiles`), kept until one of them
        changes; None where no such loop runs."""
        q, a, b = self.qweight, self.absmax, self.blocksize
        if (b % 32 or self.in_features % b or self.out_features % 16 or a.dtype != torch.float32
                or not q.is_cpu or not vnni.tiles_available()):
            return None
        return self.derived("tiles", lambda: nf4_tiles(q, a, self.out_features, self.in_features, b), q, a)
