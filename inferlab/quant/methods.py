"""The methods inferlab quantizes with: what each accepts, and the config it writes.

    method  bits     group size          calibration  stored as
    int8    8        per output channel  no           Int8Linear  (int8 codes, fp16 scale per row)
    int4    2, 3, 4  32/64/128 (def 128) no           Int4Linear  (nibbles, fp16 scales, uint8 zeros)
    gptq    2, 3, 4  def 128, -1 = row   yes          Int4Linear  (+ perm with act-order); hub GPTQ layout on disk
    awq     3, 4     def 128             yes          Int4Linear; hub AWQ (GEMM) layout on disk (4-bit only)
    nf4     4        block 64            no           NF4Linear   (bitsandbytes' layout)
    q8_0    8        32 (fixed)          no           GGMLLinear  (llama.cpp blocks)
    q4_0    4        32 (fixed)          no           GGMLLinear
    q4_1    4        32 (fixed)          no           GGMLLinear  (Q4_0 plus a min per block)
    q4_k    4        256 (fixed)         no           GGMLLinear
"""
from __future__ import annotations

import dataclasses

from inferlab.quant.base import QuantizationError


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    bits: tuple[int, ...]
    default_bits: int
    default_group: int | None  # None: the method has no group size argument
    fixed_group: bool = False
    calibrated: bool = False


METHODS = {
    "int8": MethodSpec((8,), 8, None),
    "int4": MethodSpec((2, 3, 4), 4, 128),
    "gptq": MethodSpec((2, 3, 4), 4, 128, calibrated=True),
    "awq": MethodSpec((3, 4), 4, 128, calibrated=True),
    "nf4": MethodSpec((4,), 4, 64),
    "q8_0": MethodSpec((8,), 8, 32, fixed_group=True),
    "q4_0": MethodSpec((4,), 4, 32, fixed_group=True),
    "q4_1": MethodSpec((4,), 4, 32, fixed_group=True),
    "q4_k": MethodSpec((4,), 4, 256, fixed_group=True),
}


def resolve(method: str, bits: int | None = None, group_size: int | None = None) -> tuple[str, int, int | None]:
    """Check a (method, bits, group size) request; fill in defaults. Raises a one-line QuantizationError."""
    method = (method or "").lower()
    if method not in METHODS:
        raise QuantizationError(f"unknown quantization method {method!r}: choose one of {', '.join(METHODS)}")
    spec = METHODS[method]
    bits = spec.default_bits if bits is None else int(bits)
    if bits not in spec.bits:
        raise QuantizationError(f"{method} supports --bits {' or '.join(map(str, spec.bits))}, not {bits}")
    if group_size is None:
        group_size = spec.default_group
    elif spec.default_group is None:
        raise QuantizationError(f"{method} has one scale per output channel: drop --group-size")
    elif spec.fixed_group and group_size != spec.default_group:
        raise QuantizationError(f"{method} blocks hold {spec.default_group} values: drop --group-size "
                                f"(got {group_size})")
    elif group_size != -1 and group_size < 2:
        raise QuantizationError(f"group size must be >= 2 (or -1 for one group per row), got {group_size}")
    elif group_size == -1 and method not in ("gptq", "int4"):
        raise QuantizationError(f"{method} needs a positive group size, got -1")
    return method, bits, group_size


def check_model(model, method: str, group_size: int | None, skip=("lm_head",)) -> None:
    """Fail before any work if a group/block size does not divide some linear's input dimension."""
    import torch.nn as nn
    if group_size in (None, -1):
        return
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name not in skip:
            n = mod.in_features if method != "nf4" else mod.in_features * mod.out_features
            if n % group_size:
                what = "block size" if method in ("nf4", "q8_0", "q4_0", "q4_1", "q4_k") else "group size"
                if METHODS[method].fixed_group:  # the block is the format's: nothing to choose
                    raise QuantizationError(f"{method} blocks hold {group_size} values, which does not divide "
                                            f"the input dimension {mod.in_features} of {name}: choose another "
                                            f"method (q8_0, q4_0 and q4_1 use blocks of 32)")
                raise QuantizationError(f"{method} {what} {group_size} does not divide the input dimension "
                                        f"{mod.in_features} of {name}: choose a divisor of {mod.in_features}")
