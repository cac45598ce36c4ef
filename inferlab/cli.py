"""``inferlab`` command line: one subcommand per module, each with its own ``main(argv)``.

    inferlab generate PROMPT [--model M] ...   stream a completion
    inferlab bench {decode,...} --json         measure against a baseline in the same process
    inferlab serve [--model M] [--port P]      an OpenAI-compatible HTTP server
    inferlab train                             train the embedded target/draft pair
    inferlab train medusa                      Medusa heads on the frozen target (speculative decoding)
    inferlab train eagle --target smollm2      an EAGLE draft on the frozen target (speculative decoding)
    inferlab train draft --target smollm2      a draft cut from the target's layers, distilled from it
    inferlab eval ppl --model M --json         perplexity on the held-out stdlib split
    inferlab quantize --model M --method X --out DIR   quantize (int8, int4, gptq, awq, nf4, q4_k ...)
    inferlab models --json                     list the embedded models
    inferlab grade labs/NN_topic               run a lab's autograder
    inferlab --version                         print the version

Command groups (``bench``, ``eval``) dispatch the same way through :func:`dispatch`.
"""
from __future__ import annotations

import argparse
import importlib
import os
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

# a command's own subcommands that live in another module (`inferlab train medusa`)
SUBCOMMANDS = {("train", "medusa"): "inferlab.spec.medusa_train", ("train", "eagle"): "inferlab.spec.eagle_train",
               ("train", "draft"): "inferlab.spec.draft_train"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` as a terminal shows it: every option's default named (unless its help already does),
    docstring markup (double backquotes) shown as plain `code`, the description's lines kept."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and "default" not in text and action.default not in (None, False)
                and action.default is not argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text

    def _format_text(self, text):
        return super()._format_text(text.replace("``", "`"))


def plural(noun: str) -> str:
    return noun + ("es" if noun.endswith("s") else "s")


def dispatch(prog: str, table: dict[str, tuple[str, str]], argv: list[str], noun: str = "command") -> int:
    """Run ``table[argv[0]]``'s module ``main(argv[1:])``; print usage for none or --help.

    An unknown name, a bad ``--device``, or an :class:`InferlabError` / ``ValueError`` raised by the
    command, prints one line (``prog: error: ...``) and returns 2; no traceback reaches the user.
    """
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"usage: {prog} {noun.upper()} [ARGS]", "", f"{plural(noun)}:"]
        lines += [f"  {name:<10} {help_}" for name, (_, help_) in table.items()]
        lines += ["", f"`{prog} {noun.upper()} --help` describes one {noun}."]
        if prog == "inferlab":
            lines[1:1] = ["", "options:", "  -h, --help  show this message and exit",
                          "  --version   print inferlab's version and exit"]
        print("\n".join(lines), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in table:
        print(f"{prog}: error: unknown {noun} {name!r}; choose one of {', '.join(table)}", file=sys.stderr)
        return 2
    try:
        check_device_args(rest)
        module = table[name][0]
        if (name, rest[0] if rest else None) in SUBCOMMANDS:
            module, rest = SUBCOMMANDS[name, rest[0]], rest[1:]
        return int(importlib.import_module(module).main(rest) or 0)
    except (InferlabError, ValueError) as exc:
        print(f"{prog} {name}: error: {exc}", file=sys.stderr)
        return 2


def add_quantization_argument(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    """``--quantization METHOD``, vLLM's flag: ``LLM(quantization=...)``'s choices (see
    ``inferlab.llm.check_quantization``); a bad name is one line that lists them."""
    from inferlab.llm import check_quantization
    from inferlab.quant.methods import METHODS

    parser.add_argument("--quantization", type=check_quantization, default=None, metavar="METHOD",
                        help=f"{help_prefix}quantize the weights at load with METHOD: {', '.join(METHODS)}; "
                             "none: no quantization, a GGUF's blocks dequantized to fp32 (default: as stored)")


def check_device_args(argv: list[str]) -> None:
    """Check every ``--device X`` before a command loads anything (one line, not torch's traceback)."""
    from inferlab.device import check_device

    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            check_device(argv[i + 1])
        elif arg.startswith("--device="):
            check_device(arg.split("=", 1)[1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            if argv[:1] == ["--version"]:
                from inferlab import __version__
                print(f"inferlab {__version__}")
                return 0
            return dispatch("inferlab", COMMANDS, argv)
        finally:
            sys.stdout.flush()  # here, so a closed pipe is seen below rather than at exit
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `inferlab ... | head`: the reader left; stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 141

if __name__ == "__main__":
    sys.exit(main())
