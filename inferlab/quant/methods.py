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

A width the group does not divide: real models are not all powers of two (SmolLM2's hidden size is
576 = 4.5 x 128), so each linear gets its own format where the method's default does not fit, as
llama.cpp's quantizer picks a fallback type per tensor:
    int4, gptq, awq  halve the group until it divides the input width (576: 64), down to 32. Hub
                     checkpoints come in groups of 32, 64 and 128, and halving keeps the kernels' shapes.
    q4_k             Q4_1 for a tensor whose width is not a multiple of 256: the 32-value block with a
                     min per block, as Q4_K's sub-blocks have (llama.cpp falls back to Q5_0, a format
                     inferlab does not run; Q4_1 keeps the tensor at 4 bits and has a decode loop here).
    nf4              blocks run over the flattened weight: only out * in must be a multiple of the block.
Each exception is written per tensor in ``quantization_config["modules"]`` (see :func:`tensor_format`).
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


BLOCK_FALLBACK = {"q4_k": "q4_1"}  # a llama.cpp type -> the type of a tensor its block does not fit
MIN_GROUP = 32


def tensor_format(method: str, group_size: int | None, in_features: int, out_features: int = 1) -> dict:
    """How one linear of input width ``in_features`` is stored under ``method``: {} when the
    method's own (group) size fits, else the override, {"group_size": g} or {"quant_method": t}.
    Raises a one-line QuantizationError when nothing fits."""
    if group_size in (None, -1):
        return {}
    if method == "nf4":
        if (in_features * out_features) % group_size:
            raise QuantizationError(f"nf4 block size {group_size} does not divide the {out_features} x "
                                    f"{in_features} weight: choose a block size that divides it (e.g. 64)")
        return {}
    if in_features % group_size == 0:
        return {}
    if method in BLOCK_FALLBACK and in_features % METHODS[BLOCK_FALLBACK[method]].default_group == 0:
        return {"quant_method": BLOCK_FALLBACK[method]}
    if METHODS[method].fixed_group:
        raise QuantizationError(f"{method} blocks hold {group_size} values, which does not divide the input "
                                f"dimension {in_features}: choose another method, or a model whose widths are "
                                f"multiples of {group_size}")
    g = group_size
    while g > MIN_GROUP and in_features % g:
        g //= 2
    if in_features % g or g % 2:
        raise QuantizationError(f"{method} group size {group_size} does not divide the input dimension "
                                f"{in_features}, nor does any half of it down to {MIN_GROUP}: choose a divisor "
                                f"of {in_features}")
    return {"group_size": g}


def check_model(model, method: str, group_size: int | None, skip=("lm_head",)) -> dict[str, dict]:
    """Fail before any work if some linear cannot be stored under ``method``; else return the
    per-tensor exceptions ({name: override}, see :func:`tensor_format`)."""
    import torch.nn as nn
    plan = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name not in skip:
            fmt = tensor_format(method, group_size, mod.in_features, mod.out_features)
            if fmt:
                plan[name] = fmt
    return plan
