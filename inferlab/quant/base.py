"""What every quantized linear shares: packed buffers, ``dequantize()``, and a plain matmul.

A quantized linear keeps only its packed codes and their scales; ``forward`` rebuilds the
weight for the moment of the product (dequantize-then-matmul), so memory holds the small form.
On a GPU a fused kernel reads the packed bytes directly (``inferlab.kernels.w4a16_matmul``);
on a CPU this path is the reference the kernels are checked against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.errors import InferlabError


class QuantizationError(InferlabError, ValueError):
    """A method, bit width or group size inferlab cannot quantize with (the message says why)."""


class QuantLinear(nn.Module):
    """Base class: subclasses register their packed buffers and implement ``dequantize``."""

    method = "none"
    bits = 16

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features))
        else:
            self.register_parameter("bias", None)

    def dequantize(self) -> torch.Tensor:  # [out_features, in_features], float32
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequantize().to(x.dtype)
        return F.linear(self.prepare_input(x), w, None if self.bias is None else self.bias.to(x.dtype))

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def weight_bytes(self) -> int:
        """Bytes of the quantized weight as stored: codes plus scales, zeros and index buffers."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.weight_bytes() / (self.in_features * self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}, "
                f"bits={self.bits}, bias={self.bias is not None}")


def check_divides(group_size: int, in_features: int, what: str = "group size") -> None:
    if group_size <= 0 or in_features % group_size:
        raise QuantizationError(f"{what} {group_size} does not divide the input dimension {in_features}: "
                                f"choose a divisor of {in_features} (e.g. 32, 64 or 128)")
