"""INT4 (and 2/3-bit) group-wise asymmetric round-to-nearest, two codes per byte.

Each output row is cut into groups of ``group_size`` input columns; each group gets its own
scale and zero point, so one outlier only spoils its own group:

    scale = (max - min) / (2^bits - 1)      zero = round(-min / scale)  (clamped to the code range)
    q     = clamp(round(w / scale) + zero, 0, 2^bits - 1)
    w~    = (q - zero) * scale

Storage (the layout inferlab's W4A16 kernel reads):
    qweight  uint8   [out, in // 2]   byte [n, j] = q[n, 2j] | q[n, 2j + 1] << 4 (low nibble = even column)
    scales   float16 [out, in // G]
    zeros    uint8   [out, in // G]   0..15
    perm     int32   [in]  (optional)  act-order: the columns in the order they were quantized, so each
                                        group is contiguous; the input is permuted to match, x[..., perm]
3-bit and 2-bit codes use the same nibbles (only 8 or 4 of the 16 values), so their memory is that of
4 bits; the bit width changes the error, not the bytes.
"""
from __future__ import annotations

import sys

import torch

from inferlab.quant import fused, vnni
from inferlab.quant.base import QuantizationError, QuantLinear, check_divides


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes [out, in] in 0..15 -> bytes [out, in // 2], low nibble = even column."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [out, in // 2] -> codes [out, in] (uint8), the inverse of :func:`pack_int4`."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """The reference: w[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G], float32 [out, in]."""
    q = unpack_int4(qweight).float()
    out, cols = q.shape
    q = q.view(out, cols // group_size, group_size)
    w = (q - zeros.float()[..., None]) * scales.float()[..., None]
    return w.view(out, cols)


def group_qparams(w: torch.Tensor, bits: int, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point for each row of ``w`` [..., G] from its min and max (min <= 0 <= max)."""
    maxq = 2 ** bits - 1
    lo = w.amin(-1).clamp(max=0)
    hi = w.amax(-1).clamp(min=0)
    if sym:
        hi = torch.maximum(-lo, hi)
        lo = -hi
    scale = (hi - lo) / maxq
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = torch.full_like(scale, (maxq + 1) // 2) if sym else torch.round(-lo / scale).clamp(0, maxq)
    return scale, zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    return torch.clamp(torch.round(w / scale) + zero, 0, 2 ** bits - 1)


def quantize_int4(w: torch.Tensor, group_size: int = 128, bits: int = 4, sym: bool = False):
    """Round-to-nearest: ``w`` [out, in] -> (qweight, scales, zeros) in the layout above."""
    if bits not in (2, 3, 4):
        raise QuantizationError(f"group-wise integer quantization supports --bits 2, 3 or 4, not {bits}")
    out, cols = w.shape
    check_divides(group_size, cols)
    g = w.float().view(out, cols // group_size, group_size)
    scale, zero = group_qparams(g, bits, sym)
    scale = scale.half().float()  # stored in fp16: round with the scale that will be read back
    q = quantize_codes(g, scale[..., None], zero[..., None], bits).view(out, cols)
    return pack_int4(q), scale.half(), zero.to(torch.uint8)


def tile_codes(qweight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Rows of nibbles [N, K / 2] (N a multiple of 16, groups a multiple of 32; low nibble the even
    column) as the tile loops read them: for each tile of 16 outputs and each group, its blocks of 32
    columns as [4, 16 outputs, 4 code bytes]. Returns [N / 16, groups, group_size * 8]."""
    n, half = qweight.shape
    t, groups, blocks = n // 16, 2 * half // group_size, group_size // 32
    return qweight.reshape(t, 16, groups, blocks, 4, 4).permute(0, 2, 3, 4, 1, 5).reshape(t, groups, blocks * 256)


def int4_tiles(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """INT4 rows laid out for ``inferlab_int4_tiles_gemv`` (vnni.c): for each tile of 16 outputs and
    each group, its codes (:func:`tile_codes`), then the group's 16 fp16 scales, 16 zero points and
    16 bytes of padding."""
    codes = tile_codes(qweight, group_size)
    t, groups = codes.shape[:2]
    s = scales.reshape(t, 16, groups).transpose(1, 2).contiguous().view(torch.uint8).view(t, groups, 32)
    z = zeros.reshape(t, 16, groups).transpose(1, 2)
    return torch.cat([codes, s, z, torch.zeros_like(z)], dim=-1).contiguous()


class Int4Linear(QuantLinear):
    """A linear layer holding group-wise 4-bit codes (see the module docstring for the layout)."""

    method = "int4"

    def __init__(self, in_features: int, out_features: int, bias: bool, group_size: int = 128,
                 bits: int = 4, act_order: bool = False):
        super().__init__(in_features, out_features, bias)
        check_divides(group_size, in_features)
        self.group_size, self.bits = group_size, bits
        n_groups = in_features // group_size
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, n_groups, dtype=torch.float16))
        self.register_buffer("zeros", torch.zeros(out_features, n_groups, dtype=torch.uint8))
        if act_order:
            self.register_buffer("perm", torch.arange(in_features, dtype=torch.int32))
        else:
            self.perm = None

    @classmethod
    def from_float(cls, linear, group_size: int = 128, bits: int = 4, sym: bool = False) -> "Int4Linear":
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, group_size, bits)
        mod.qweight, mod.scales, mod.zeros = quantize_int4(linear.weight.detach(), group_size, bits, sym)
        if linear.bias is not None:
            mod.bias.data = linear.bias.detach().float().clone()
        return mod.to(linear.weight.device)

    def dequantize(self) -> torch.Tensor:
        """The weight in the stored (possibly permuted) column order."""
        return dequantize_int4(self.qweight, self.scales, self.zeros, self.group_size)

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.perm is None else x.index_select(-1, self.perm)

    def fused(self):
        """The compiled product reads qweight as little-endian int32 words of 8 nibbles (group size a
        multiple of 8); elsewhere the reference runs. A qweight stored transposed (as some checkpoint
        layouts load) is made row-contiguous once: same values, and each row's bytes become words."""
        if self.group_size % 8 or sys.byteorder != "little":
            return None
        if self.qweight.stride(-1) != 1:
            self.qweight = self.qweight.contiguous()
        if self.qweight.storage_offset() % 4:
            return None
        return fused.int4_matmul, self.qweight.view(torch.int32), self.scales, self.zeros, self.group_size

    def kernel(self, x: torch.Tensor) -> torch.Tensor | None:
        """On a GPU, the fused W4A16 Triton kernel reads the packed codes and never writes the fp16
        weight to memory (``inferlab.kernels.w4a16_matmul``); on the CPU, for decode and prompt rows
        alike, the loop of ``inferlab.quant.vnni`` (int8 activations; over tiles of 16 outputs where
        AVX-512 VNNI runs them, else groups of a multiple of 64), else (None) the compiled product of
        ``inferlab.quant.fused`` for a few rows, and dequantize-then-matmul."""
        if not x.is_cuda:
            if not torch.compiler.is_compiling() and (tiles := self.tiles()) is not None:
                y = vnni.int4_tiles_linear(x, tiles, self.out_features, self.group_size)
                if y is not None:
                    return y
            return vnni.int4_linear(x, self.qweight, self.scales, self.zeros, self.group_size)
        from inferlab.kernels.w4a16_matmul import w4a16_matmul

        return w4a16_matmul(x, self.qweight, self.scales, self.zeros, self.group_size)

    def tiles(self) -> torch.Tensor | None:
        """The codes, scales and zero points in tiles of 16 outputs (:func:`int4_tiles`) for the loop that
        takes several rows at once, kept until one of them changes; None where no such loop runs."""
        q, s, z = self.qweight, self.scales, self.zeros
        if (self.perm is not None or self.group_size % 32 or self.out_features % 16 or s.dtype != torch.float16
                or z.dtype != torch.uint8 or not q.is_cpu or not vnni.tiles_available()):
            return None
        return self.derived("tiles", lambda: int4_tiles(q, s, z, self.group_size), q, s, z)

    def dequantize_original_order(self) -> torch.Tensor:
        w = self.dequantize()
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm.long()] = w
        return out
