"""``inferlab`` command line: one subcommand per module, each with its own ``main(argv)``.

    inferlab generate PROMPT [--model M] ...   stream a completion
    inferlab bench {decode,...} --json         measure against a baseline in the same process
    inferlab serve [--model M] [--port P]      an OpenAI-compatible HTTP server
    inferlab train                             train the embedded target/draft pair
    inferlab eval ppl --model M --json         perplexity on the held-out stdlib split
    inferlab quantize --model M --method X --out DIR   quantize (int8, int4, gptq, awq, nf4, q4_k ...)
    inferlab models --json                     list the embedded models
    inferlab grade labs/NN_topic               run a lab's autograder

Command groups (``bench``, ``eval``) dispatch the same way through :func:`dispatch`.
"""
from __future__ import annotations

import importlib
import sys

from inferlab.errors import InferlabError

COMMANDS = {
    "generate": ("inferlab.generate_cli", "stream a completion for one prompt"),
    "bench": ("inferlab.bench", "benchmarks that print ratios against a baseline"),
    "serve": ("inferlab.serve", "an OpenAI-compatible HTTP server on the engine"),
    "train": ("inferlab.train", "train the embedded target and draft models"),
    "eval": ("inferlab.eval", "evaluation harnesses (perplexity)"),
    "quantize": ("inferlab.quant.cli", "quantize a model (int8, int4, gptq, awq, nf4, gguf blocks)"),
    "distill": ("inferlab.spec.distill", "distil the draft from the target (speculative decoding)"),
    "models": ("inferlab.embedded", "list the embedded models"),
    "grade": ("inferlab.grade", "grade a lab (Gradescope-style results)"),
}


def dispatch(prog: str, table: dict[str, tuple[str, str]], argv: list[str], noun: str = "command") -> int:
    """Run ``table[argv[0]]``'s module ``main(argv[1:])``; print usage for none or --help.

    An unknown name, or an :class:`InferlabError` / ``ValueError`` raised by the command, prints
    one line (``prog: error: ...``) and returns 2; no traceback reaches the user.
    """
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"usage: {prog} {noun.upper()} [ARGS]", "", f"{noun}s:"]
        lines += [f"  {name:<10} {help_}" for name, (_, help_) in table.items()]
        lines += ["", f"`{prog} {noun.upper()} --help` describes one {noun}."]
        print("\n".join(lines), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in table:
        print(f"{prog}: error: unknown {noun} {name!r}; choose one of {', '.join(table)}", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(table[name][0]).main(rest) or 0)
    except (InferlabError, ValueError) as exc:
        print(f"{prog} {name}: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    try:
        return dispatch("inferlab", COMMANDS, sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
