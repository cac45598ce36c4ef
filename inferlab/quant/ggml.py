"""llama.cpp's block formats, byte for byte (ggml-quants.c; the GGUF file stores these bytes).

    Q8_0  32 values in 34 bytes:  fp16 d | 32 x int8 q                  w = d * q
    Q4_0  32 values in 18 bytes:  fp16 d | 16 bytes of nibbles           w = d * (q - 8)
          (value i in the low nibble of byte i, value i + 16 in its high nibble)
    Q4_1  32 values in 20 bytes:  fp16 d | fp16 m | 16 bytes of nibbles  w = d * q + m
          (Q4_0's nibbles with a min: the grid spans [min, max] of the block, not [-amax, amax],
          so a block whose values are all of one sign wastes no codes. 5 bits per weight.)
    Q4_K  256 values in 144 bytes: fp16 d | fp16 dmin | 12 bytes: 8 six-bit scales and 8 six-bit
          mins | 128 bytes of nibbles. Eight sub-blocks of 32 each have w = d*sc_j * q - dmin*m_j:
          the super-block's two fp16 numbers scale 6-bit sub-block scales, so the sub-blocks cost
          12 bits each instead of 32. 4.5 bits per weight.

Quantization follows the reference C code (``quantize_row_q8_0_ref``, ``_q4_0_ref``, ``_q4_1_ref``, ``_q4_K_ref``
with its ``make_qkx2_quants`` search for each sub-block's scale and min).
"""
from __future__ import annotations

import torch

from inferlab.quant import fused, vnni
from inferlab.quant.base import QuantizationError, QuantLinear

BLOCKS = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q4_k": (256, 144)}  # values per block, bytes per block


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8).view(*x.shape, 2)


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float().squeeze(-1)


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: halves away from zero (torch.round rounds halves to even)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _blocks(w: torch.Tensor, size: int) -> torch.Tensor:
    if w.shape[-1] % size:
        raise QuantizationError(f"this format packs {size} values per block: the input dimension "
                                f"{w.shape[-1]} is not a multiple of {size}")
    return w.detach().float().reshape(-1, size)


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    x = _blocks(w, 32)
    d = x.abs().amax(1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = _roundf(x * inv).to(torch.int8)
    return torch.cat([_f16_bytes(d[:, 0]), q.view(torch.uint8)], 1).reshape(w.shape[0], -1)


def dequantize_q8_0(b: torch.Tensor) -> torch.Tensor:
    b = b.reshape(-1, 34)
    return _f16(b[:, :2])[:, None] * b[:, 2:].contiguous().view(torch.int8).float()


def quantize_q4_0(w: torch.Tensor) -> torch.Tensor:
    x = _blocks(w, 32)
    imax = x.abs().argmax(1, keepdim=True)
    d = x.gather(1, imax) / -8  # the largest-magnitude value maps exactly to code 0
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(x * inv + 8.5).clamp(0, 15).to(torch.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([_f16_bytes(d[:, 0]), packed], 1).reshape(w.shape[0], -1)


def dequantize_q4_0(b: torch.Tensor) -> torch.Tensor:
    b = b.reshape(-1, 18)
    qs = b[:, 2:]
    q = torch.cat([qs & 0x0F, qs >> 4], 1).float() - 8
    return _f16(b[:, :2])[:, None] * q


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """d = (max - min) / 15 and m = min: the block's range split into 15 steps. q is computed with
    the fp32 d (the C code's, before d is stored as fp16) and rounded half up: (x - min) >= 0."""
    x = _blocks(w, 32)
    lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc((x - lo) * inv + 0.5).clamp(0, 15).to(torch.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([_f16_bytes(d[:, 0]), _f16_bytes(lo[:, 0]), packed], 1).reshape(w.shape[0], -1)


def dequantize_q4_1(b: torch.Tensor) -> torch.Tensor:
    b = b.reshape(-1, 20)
    qs = b[:, 4:]
    q = torch.cat([qs & 0x0F, qs >> 4], 1).float()
    return _f16(b[:, :2])[:, None] * q + _f16(b[:, 2:4])[:, None]


def make_qkx2_quants(x: torch.Tensor, weights: torch.Tensor, nmax: int = 15, rmin: float = -1.0,
                     rdelta: float = 0.1, nstep: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x`` [N, 32]: the (scale, min) with x ~ scale * q - min that minimises the weighted
    squared error, searched over nstep + 1 candidate scales, each refit by least squares."""
    lo = x.amin(1).clamp(max=0)
    hi = x.amax(1)
    span = (hi - lo).clamp(min=1e-30)
    best_scale, best_min = span / nmax, -lo
    q = _roundf((x - lo[:, None]) * (nmax / span)[:, None]).clamp(0, nmax)
    best_err = (weights * (best_scale[:, None] * q + lo[:, None] - x) ** 2).sum(1)
    sw, sx = weights.sum(1), (weights * x).sum(1)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / span
        q = _roundf(iscale[:, None] * (x - lo[:, None])).clamp(0, nmax)
        sl, sl2, sxl = (weights * q).sum(1), (weights * q * q).sum(1), (weights * q * x).sum(1)
        det = sw * sl2 - sl * sl
        ok = det > 0
        scale = torch.where(ok, (sw * sxl - sx * sl) / torch.where(ok, det, 1), best_scale)
        mn = torch.where(ok, (sl2 * sx - sl * sxl) / torch.where(ok, det, 1), lo)
        pos = mn > 0  # the min is kept <= 0 (stored as a non-negative offset)
        scale = torch.where(pos, sxl / sl2.clamp(min=1e-30), scale)
        mn = torch.where(pos, torch.zeros_like(mn), mn)
        err = (weights * (scale[:, None] * q + mn[:, None] - x) ** 2).sum(1)
        better = ok & (err < best_err)
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, scale, best_scale)
        best_min = torch.where(better, -mn, best_min)
    flat = hi == lo
    return torch.where(flat, torch.zeros_like(best_scale), best_scale), torch.where(flat, -lo, best_min)


def quantize_q4_k(w: torch.Tensor) -> torch.Tensor:
    x = _blocks(w, 256)
    n = x.shape[0]
    sub = x.view(n * 8, 32)
    av = (sub.pow(2).mean(1, keepdim=True)).sqrt()
    scales, mins = make_qkx2_quants(sub, av + sub.abs())
    scales, mins = scales.view(n, 8), mins.view(n, 8)
    max_scale, max_min = scales.amax(1, keepdim=True), mins.amax(1, keepdim=True)
    inv_s = torch.where(max_scale > 0, 63 / max_scale, torch.zeros_like(max_scale))
    inv_m = torch.where(max_min > 0, 63 / max_min, torch.zeros_like(max_min))
    ls = _roundf(inv_s * scales).clamp(max=63).to(torch.uint8)
    lm = _roundf(inv_m * mins).clamp(max=63).to(torch.uint8)
    d, dmin = (max_scale / 63).half().float(), (max_min / 63).half().float()
    packed_sc = torch.cat([ls[:, :4] | ((ls[:, 4:] >> 4) << 6), lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
                           (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)], 1)
    eff_d, eff_m = (d * ls.float()).view(n, 8, 1), (dmin * lm.float()).view(n, 8, 1)
    safe = torch.where(eff_d == 0, torch.ones_like(eff_d), eff_d)
    q = torch.where(eff_d == 0, torch.zeros_like(eff_d), _roundf((x.view(n, 8, 32) + eff_m) / safe))
    q = q.clamp(0, 15).to(torch.uint8).view(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).view(n, 128)
    out = torch.cat([_f16_bytes(d[:, 0]), _f16_bytes(dmin[:, 0]), packed_sc, qs], 1)
    return out.reshape(w.shape[0], -1)


def q4_k_scales_mins(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12 scale bytes [N, 12] into 8 six-bit scales and 8 six-bit mins."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scales = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], 1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], 1)
    return scales, mins


def dequantize_q4_k(b: torch.Tensor) -> torch.Tensor:
    b = b.reshape(-1, 144)
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = q4_k_scales_mins(b[:, 4:16])
    qs = b[:, 16:].reshape(n, 4, 1, 32)
    q = torch.cat([qs & 0x0F, qs >> 4], 2).reshape(n, 8, 32).float()
    return (d[:, None, None] * sc.float()[..., None] * q - dmin[:, None, None] * mn.float()[..., None]).view(n, 256)


QUANTIZE = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0, "q4_1": quantize_q4_1, "q4_k": quantize_q4_k}
DEQUANTIZE = {"q8_0": dequantize_q8_0, "q4_0": dequantize_q4_0, "q4_1": dequantize_q4_1, "q4_k": dequantize_q4_k}
FUSED = {"q8_0": fused.q8_0_matmul, "q4_0": fused.q4_0_matmul, "q4_1": fused.q4_1_matmul,
         "q4_k": fused.q4_k_matmul}


def block_tiles(qweight: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """Q8_0, Q4_0, Q4_1 or Q4_K rows [N, bytes] (N a multiple of 16) laid out for the loops over tiles
    of 16 outputs (``inferlab_*_tiles_gemv`` in vnni.c: why): for each tile and each block of 32
    columns, the 16 outputs' code bytes interleaved 4 at a time ([code bytes / 4, 16 outputs, 4 bytes]),
    then their 16 fp16 scales d and (Q4_1) their 16 fp16 mins m. The same bytes, in another order;
    Q4_K's own layout: :func:`q4_k_tiles`."""
    if ggml_type == "q4_k":
        return q4_k_tiles(qweight)
    _, nbytes = BLOCKS[ggml_type]
    head = 4 if ggml_type == "q4_1" else 2  # the fp16 numbers before each block's codes: d, and Q4_1's m
    n = qweight.shape[0]
    blocks = qweight.view(n // 16, 16, -1, nbytes)  # [tile, output, block, byte]
    t, b, groups = blocks.shape[0], blocks.shape[2], (nbytes - head) // 4
    codes = blocks[..., head:].reshape(t, 16, b, groups, 4).permute(0, 2, 3, 1, 4).reshape(t, b, 64 * groups)
    numbers = [blocks[..., 2 * k:2 * k + 2].permute(0, 2, 1, 3).reshape(t, b, 32) for k in range(head // 2)]
    return torch.cat([codes, *numbers], dim=-1).contiguous()


def q4_k_tiles(qweight: torch.Tensor) -> torch.Tensor:
    """Q4_K rows [N, super-blocks * 144] as tiles of 16 outputs: for each tile and super-block of 256
    columns, its 4 chunks of 64 columns as [8, 16 outputs, 4 code bytes] (a chunk's low nibbles are
    sub-block 2i, its high ones 2i + 1), then the 16 fp16 d, the 16 fp16 dmin, and the 6-bit scales
    and mins unpacked to a byte each as [8 sub-blocks, 16 outputs]: 2,368 bytes per 16 super-blocks
    of 144 (``inferlab_q4_k_tiles_gemv``)."""
    n = qweight.shape[0]
    blocks = qweight.view(n // 16, 16, -1, 144)  # [tile, output, super-block, byte]
    t, s = blocks.shape[0], blocks.shape[2]
    codes = blocks[..., 16:].reshape(t, 16, s, 4, 8, 4).permute(0, 2, 3, 4, 1, 5).reshape(t, s, 2048)
    d, dmin = (blocks[..., k:k + 2].permute(0, 2, 1, 3).reshape(t, s, 32) for k in (0, 2))
    sc, mn = q4_k_scales_mins(blocks[..., 4:16].reshape(-1, 12))
    sc, mn = (v.view(t, 16, s, 8).permute(0, 2, 3, 1).reshape(t, s, 128) for v in (sc, mn))
    return torch.cat([codes, d, dmin, sc, mn], dim=-1).contiguous()


class GGMLLinear(QuantLinear):
    """A linear layer whose weight rows are llama.cpp blocks (``qweight`` uint8 [out, bytes per row])."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ggml_type: str = "q4_k"):
        super().__init__(in_features, out_features, bias)
        if ggml_type not in BLOCKS:
            raise QuantizationError(f"unknown llama.cpp block type {ggml_type!r}: choose one of {', '.join(BLOCKS)}")
        size, nbytes = BLOCKS[ggml_type]
        if in_features % size:
            raise QuantizationError(f"{ggml_type} packs {size} values per block: the input dimension "
                                    f"{in_features} is not a multiple of {size}")
        self.method = self.ggml_type = ggml_type
        self.bits = 8 if ggml_type == "q8_0" else 4
        self.register_buffer("qweight", torch.zeros(out_features, in_features // size * nbytes, dtype=torch.uint8))

    @classmethod
    def from_float(cls, linear, ggml_type: str) -> "GGMLLinear":
        return cls.from_weight(linear.weight, ggml_type, linear.bias)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, ggml_type: str, bias: torch.Tensor | None = None) -> "GGMLLinear":
        """The linear of ``weight`` [out, in] (and ``bias``), its rows in ``ggml_type`` blocks."""
        mod = cls(weight.shape[1], weight.shape[0], bias is not None, ggml_type)
        mod.qweight = QUANTIZE[ggml_type](weight)
        if bias is not None:
            mod.bias.data = bias.detach().float().clone()
        return mod.to(weight.device)

    def dequantize(self) -> torch.Tensor:
        return DEQUANTIZE[self.ggml_type](self.qweight).view(self.out_features, self.in_features)

    def fused(self):
        return FUSED[self.ggml_type], self.qweight

    def tiles(self) -> torch.Tensor | None:
        """qweight in tiles of 16 outputs (:func:`block_tiles`) for the loop that takes several rows
        at once, kept until qweight changes (a copy: the plain rows stay what is saved, exported and
        dequantized); None where no such loop runs."""
        q = self.qweight
        if self.ggml_type not in vnni.TILED_TYPES or self.out_features % 16 or not q.is_cpu or not vnni.tiles_available():
            return None
        return self.derived("tiles", lambda: block_tiles(q, self.ggml_type), q)

    def kernel(self, x: torch.Tensor) -> torch.Tensor | None:
        """Decode on an x86 CPU with AVX-512 VNNI: the integer dot products of ``inferlab.quant.vnni``,
        over tiles of 16 outputs where the format has that loop."""
        if not torch.compiler.is_compiling() and (tiles := self.tiles()) is not None:
            y = vnni.ggml_tiles_linear(x, tiles, self.out_features, self.ggml_type)
            if y is not None:
                return y
        return vnni.ggml_linear(x, self.qweight, self.ggml_type)
