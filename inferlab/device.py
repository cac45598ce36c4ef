"""Where the engine runs: CUDA when present, else CPU; fp32 on CPU, bf16 on GPU.

CPU bf16 matmuls are ~60x slower than fp32 on AVX2 machines without AMX, so the CPU computes
in fp32 even when the checkpoint is stored in 16 bits.
"""
from __future__ import annotations

import functools

import torch

from inferlab.errors import InferlabError


def check_device(name: str | None) -> None:
    """A one-line error for a device this torch cannot use (an unknown name, CUDA on a CPU build)."""
    if name is None:
        return
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise InferlabError(f"unknown device {name!r}: use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda", "meta"):
        raise InferlabError(f"device {name!r} is not supported: use cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise InferlabError(f"--device {name}: {why} (torch {torch.__version__}): use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InferlabError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device) -> torch.dtype:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def parse_dtype(name: str | torch.dtype | None, device) -> torch.dtype:
    if name is None or name == "auto":
        return default_dtype(device)
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}: choose one of {', '.join(table)}")
    return table[name]


@functools.cache
def compile_errors() -> tuple[type[BaseException], ...]:
    """What torch.compile raises when compilation itself fails (no C++ compiler, an unsupported op):
    only these fall back to eager; any other error is a real error. Looked up when an error is
    caught (``except compile_errors()``): importing torch._dynamo takes a second that a process
    which never compiles should not pay."""
    errors: list[type[BaseException]] = []
    try:
        from torch._dynamo.exc import TorchDynamoException
        errors.append(TorchDynamoException)
        from torch._inductor.exc import InductorError
        errors.append(InductorError)
    except ImportError:
        pass
    return tuple(errors) or (RuntimeError,)

