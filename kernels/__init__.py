"""Triton kernels, one per file, each beside its torch reference, a correctness check and a benchmark.

Without a CUDA device, Triton runs kernels through its interpreter (numpy on the CPU, about
1000x slower than compiled: keep shapes small). The interpreter is chosen by the environment
variable TRITON_INTERPRET=1, which Triton reads when it is first imported, so this package sets
it here, before any kernel module imports triton. Import ``inferlab.kernels`` before ``triton``.

The folder is `kernels/` at the top of the repository; it installs as ``inferlab.kernels``.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
