"""Kernel tests run on the GPU when there is one (fp16 and bf16, compiled), else on the CPU through
Triton's interpreter (fp32 only, ~1000x slower: shapes stay small)."""
import pytest
import torch

import inferlab.kernels  # noqa: F401  (before triton: picks the interpreter on a CPU)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


def tol(dtype):
    return {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def dtype(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
