"""``inferlab eval``: evaluation harnesses, one submodule per harness.

    inferlab eval ppl [--model target] [--split test] [--max-tokens N] --json
"""
from __future__ import annotations

import importlib

from inferlab.errors import InferlabError

HARNESSES = {"ppl": ("inferlab.eval.ppl", "perplexity on a held-out split of the stdlib corpus")}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        lines = ["usage: inferlab eval HARNESS [ARGS]", "", "harnesses:"]
        lines += [f"  {name:<6} {help_}" for name, (_, help_) in HARNESSES.items()]
        print("\n".join(lines))
        return 0 if argv else 2
    if argv[0] not in HARNESSES:
        raise InferlabError(f"unknown harness {argv[0]!r}: choose one of {', '.join(HARNESSES)}")
    return int(importlib.import_module(HARNESSES[argv[0]][0]).main(argv[1:]) or 0)
