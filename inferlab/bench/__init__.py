"""``inferlab bench NAME``: benchmarks that run a baseline in the same process and print ratios.

These machines are shared and noisy, so absolute times mean little; a ratio of two runs made
side by side, best of several repeats, is what each benchmark reports.
"""
from __future__ import annotations

import importlib
import sys

BENCHES = {
    "decode": ("inferlab.bench.decode", "single-stream greedy decode: inferlab vs transformers"),
    "quant": ("inferlab.bench.quant", "every quantization method: bytes, perplexity, decode speed"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: inferlab bench NAME [ARGS]\n\nbenchmarks:")
        for name, (_, help_) in BENCHES.items():
            print(f"  {name:<8} {help_}")
        return 0 if argv else 2
    if argv[0] not in BENCHES:
        print(f"inferlab bench: error: unknown benchmark {argv[0]!r}; choose one of {', '.join(BENCHES)}",
              file=sys.stderr)
        return 2
    return importlib.import_module(BENCHES[argv[0]][0]).main(argv[1:])
