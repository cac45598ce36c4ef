"""NF4: 4-bit NormalFloat with per-block absmax (Dettmers et al. 2023, QLoRA).

Trained weights are roughly normal, so the 16 code values are placed at quantiles of N(0, 1)
(scaled to [-1, 1], with an exact 0) instead of evenly: each code is used about equally often.
A block of 64 consecutive weights (row-major) shares one absmax; a weight is stored as the index
of the nearest code value to ``w / absmax``.

Layout (bitsandbytes' own, so its ``dequantize_4bit`` reads these bytes unchanged):
    qweight  uint8   [out * in // 2]   byte i = code[2i] << 4 | code[2i + 1]  (high nibble first)
    absmax   float32 [out * in // blocksize]
"""
from __future__ import annotations

import torch

from inferlab.quant import fused, vnni
from inferlab.quant.base import QuantizationError, QuantLinear

# The NF4 code values published with QLoRA (and used by bitsandbytes).
NF4_CODE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0])


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
        """Decode on an x86 CPU with AVX-512: ``inferlab.quant.vnni``'s table-lookup loop (exact, in float)."""
        return vnni.nf4_linear(x, self.qweight, self.absmax, NF4_CODE, self.blocksize)
