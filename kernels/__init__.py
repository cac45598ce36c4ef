"""Triton kernels, one per file, each beside its torch reference, a correctness check and a benchmark.

Without a CUDA device, Triton runs kernels through its interpreter (numpy on the CPU, about
1000x slower than compiled: keep shapes small). The interpreter is chosen by the environment
variable TRITON_INTERPRET=1, which Triton reads when it is first imported, so this package sets
it here, before any kernel module imports triton. Import ``inferlab.kernels`` before ``triton``.
(torch itself may import triton first, e.g. while it builds a model; then triton is imported
again here, so that its own helpers such as ``tl.zeros`` run in the interpreter too.)

The folder is `kernels/` at the top of the repository; it installs as ``inferlab.kernels``.
"""
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _reimport_triton_for_the_interpreter() -> None:
    """Triton picks compiled or interpreted functions when it is imported; if it was imported
    before the variable was set, drop its Python modules from the module cache (not its compiled
    extension, which loads once per process) so the next import starts afresh."""
    language = sys.modules.get("triton.language")
    if language is None or type(language.zeros).__name__ == "InterpretedFunction":
        return
    for name in [n for n in sys.modules if (n == "triton" or n.startswith("triton.")) and not n.startswith("triton._C")]:
        del sys.modules[name]


if INTERPRETED and "triton" in sys.modules:
    _reimport_triton_for_the_interpreter()
