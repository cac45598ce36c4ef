"""The linear-layer seam.

Every projection in the model (q/k/v/o, gate/up/down, lm_head) is built by a *linear factory*.
The default builds ``torch.nn.Linear``. A quantizer swaps in its own module, with the same
``forward(x) -> x @ W.T + b`` contract, either at build time (pass ``linear_factory`` to the
model) or afterwards with :func:`replace_linears`. The model never needs to know.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import nn
from torch.nn import functional as F


class LinearFactory(Protocol):
    def __call__(self, in_features: int, out_features: int, bias: bool, name: str) -> nn.Module: ...


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose products on the CPU run
    :mod:`inferlab.quant.f32`'s loop, which reads the weight once for all the rows of a decode step
    and gives each row the same bits whatever rows share the call; a GPU and training run ``F.linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` through the f32 loop where it runs (float32 on a CPU, no autograd), else ``F.linear``."""
    y = (_f32_linear or _load_f32_linear())(x, weight, bias)
    return F.linear(x, weight, bias) if y is None else y


_f32_linear = None


def _load_f32_linear():
    global _f32_linear
    from inferlab.quant import f32  # not at import time: inferlab.quant imports this module
    _f32_linear = f32.linear
    return _f32_linear


def default_linear(in_features: int, out_features: int, bias: bool, name: str) -> nn.Module:
    return Linear(in_features, out_features, bias=bias)


def replace_linears(
    model: nn.Module,
    convert: Callable[[str, nn.Linear], nn.Module | None],
    skip: Callable[[str], bool] = lambda name: name == "lm_head",
) -> list[str]:
    """Replace each ``nn.Linear`` named ``name`` by ``convert(name, linear)`` (None keeps it).

    Returns the names replaced. The lm_head is skipped by default: most quantization recipes
    (GPTQ, AWQ) leave it in high precision.
    """
    replaced = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and not skip(name):
            new = convert(name, module)
            if new is None:
                continue
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, new)
            replaced.append(name)
    return replaced
