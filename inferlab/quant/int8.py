"""INT8 per-output-channel symmetric absmax (LLM.int8's vector-wise weights, without the outlier split).

Each output row n gets one scale, ``s_n = max_k |w[n, k]| / 127``; codes ``q = round(w / s_n)`` lie in
-127..127. Per-channel scales cost 16 bits per row, so storage is ~8 bits per weight: half of fp16.
"""
from __future__ import annotations

import torch

from inferlab.quant import fused, vnni
from inferlab.quant.base import QuantLinear


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (int8 codes [out, in], float16 scales [out])."""
    scale = (w.float().abs().amax(dim=1) / 127).clamp(min=1e-12).half()
    q = torch.round(w.float() / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int8_tiles(qweight: torch.Tensor) -> torch.Tensor:
    """INT8 codes [N, K] (N a multiple of 16, K of 32) laid out for ``inferlab_int8_tiles_gemv``
    (vnni.c): for each tile of 16 outputs and each block of 32 columns, 16 column pairs of
    [16 outputs, 2 codes]. The same bytes, in another order."""
    n, k = qweight.shape
    return qweight.view(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()


class Int8Linear(QuantLinear):
    method, bits = "int8", 8

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__(in_features, out_features, bias)
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.float16))

    @classmethod
    def from_float(cls, linear) -> "Int8Linear":
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None)
        mod.qweight, mod.scales = quantize_int8(linear.weight.detach())
        if linear.bias is not None:
            mod.bias.data = linear.bias.detach().float().clone()
        return mod.to(linear.weight.device)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    def _float_scales(self) -> torch.Tensor:
        """The fp16 scales as float32, converted once (N numbers), again if the buffer changes."""
        return self.derived("scales32", self.scales.float, self.scales)

    def tiles(self) -> torch.Tensor | None:
        """qweight in tiles of 16 outputs (:func:`int8_tiles`) for the loop that takes several rows at
        once, kept until qweight changes; None where no such loop runs."""
        q = self.qweight
        if self.out_features % 16 or self.in_features % 32 or not q.is_cpu or not vnni.tiles_available():
            return None
        return self.derived("tiles", lambda: int8_tiles(q), q)

    def fused(self):
        return fused.int8_matmul, self.qweight, self.scales

    def kernel(self, x: torch.Tensor) -> torch.Tensor | None:
        """On the CPU, integer products: ``inferlab.quant.vnni``'s loop where the CPU has AVX-512
        VNNI, else ``torch._int_mm`` (:func:`inferlab.quant.fused.int8_w8a8`); None elsewhere (on a
        GPU the compiled dequantize-inside-the-reduction product runs, the reference above it)."""
        y = None
        if not torch.compiler.is_compiling() and (tiles := self.tiles()) is not None:
            y = vnni.int8_tiles_linear(x, tiles, self.scales)
        if y is None:
            y = vnni.int8_linear(x, self.qweight, self.scales)
        if y is None:
            scales = self.scales.float() if torch.compiler.is_compiling() else self._float_scales()
            y = fused.w8a8_call(x, self.qweight, scales)
        return y
