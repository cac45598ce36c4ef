"""``inferlab eval``: evaluation harnesses, one submodule per harness.

    inferlab eval ppl [--model target] [--split test] [--max-tokens N] --json
"""
from __future__ import annotations

HARNESSES = {"ppl": ("inferlab.eval.ppl", "perplexity on a held-out split of the stdlib corpus")}


def main(argv: list[str]) -> int:
    from inferlab.cli import dispatch

    return dispatch("inferlab eval", HARNESSES, argv, noun="harness")
