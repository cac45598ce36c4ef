"""What every quantized linear shares: packed buffers, ``dequantize()``, and a plain matmul.

A quantized linear keeps only its packed codes and their scales. ``forward_reference`` rebuilds
the weight for the moment of the product (dequantize-then-matmul): readable, and the reference the
fast paths are tested against, but it writes and re-reads an fp32 weight, so it is slower than fp32.
``forward`` runs a path that reads the packed bytes directly: the loops of ``inferlab.quant.vnni``
(AVX-512 VNNI, AVX2 or NEON builds) for any number of rows, else for a few rows the compiled
dequantize-inside-the-reduction products of ``inferlab.quant.fused``; on a GPU with 4-bit codes,
the W4A16 Triton kernel (``inferlab.kernels.w4a16_matmul``). INT8, INT4 and the Q8_0/Q4_0/Q4_1 blocks
have loops over tiles of 16 outputs (a copy of the codes: :meth:`QuantLinear.derived`) that take
prompts too. Elsewhere (no loop, prefill) it falls back to the reference, where the one
dequantization is shared by many rows.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.errors import InferlabError
from inferlab.quant.fused import fused_call


class QuantizationError(InferlabError, ValueError):
    """A method, bit width or group size inferlab cannot quantize with (the message says why)."""


def version(t: torch.Tensor) -> int:
    """t's count of in-place changes; -1 for a tensor made under inference mode, which keeps none
    (a change in place to such a tensor goes unseen by what was derived from it)."""
    return -1 if t.is_inference() else t._version


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

    def fused(self):
        """(function, buffers) of this format's product in ``inferlab.quant.fused``; None: no fast path."""
        return None

    def derived(self, name: str, build, *sources: torch.Tensor) -> torch.Tensor:
        """``build()``: a tensor made from ``sources`` (another layout of the codes, float scales), kept
        under ``name`` until one of them moves or changes in place (``load_state_dict`` copies in place)
        and built again then. Not a buffer: it is not saved, and a copy of the module rebuilds its own."""
        key = tuple((t.data_ptr(), version(t)) for t in sources)
        kept = self.__dict__.setdefault("_derived", {})
        hit = kept.get(name)
        if hit is None or hit[0] != key:
            hit = kept[name] = (key, build())
        return hit[1]

    def kernel(self, x: torch.Tensor) -> torch.Tensor | None:
        """This format's hand-written product of the prepared input, without the bias (a VNNI loop of
        ``inferlab.quant.vnni``, a Triton kernel on a GPU); None where it does not run."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The first path that runs: :meth:`kernel`, the compiled product of :meth:`fused`, the reference."""
        x = self.prepare_input(x)
        y = self.kernel(x)
        if y is None:
            spec = self.fused()
            y = None if spec is None else fused_call(spec[0], x, *spec[1:])
        if y is None:
            return self._reference(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize-then-matmul: what every fast path must match."""
        return self._reference(self.prepare_input(x))

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        w = self.dequantize().to(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

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
