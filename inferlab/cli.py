"""``inferlab`` command line: one subcommand per module, each with its own ``main(argv)``.

    inferlab generate PROMPT [--model M] ...   stream a completion
    inferlab bench {decode,...} --json         measure against a baseline in the same process
    inferlab train                             train the embedded target/draft pair
    inferlab eval ppl --model M --json         perplexity on the held-out stdlib split
    inferlab quantize --model M --method X --out DIR   quantize (int8, int4, gptq, awq, nf4, q4_k ...)
    inferlab models --json                     list the embedded models
    inferlab grade labs/NN_topic               run a lab's autograder
"""
from __future__ import annotations

import importlib
import sys

from inferlab.errors import InferlabError

COMMANDS = {
    "generate": ("inferlab.generate_cli", "stream a completion for one prompt"),
    "bench": ("inferlab.bench", "benchmarks that print ratios against a baseline"),
    "train": ("inferlab.train", "train the embedded target and draft models"),
    "eval": ("inferlab.eval", "evaluation harnesses (perplexity)"),
    "quantize": ("inferlab.quant.cli", "quantize a model (int8, int4, gptq, awq, nf4, gguf blocks)"),
    "models": ("inferlab.embedded", "list the embedded models"),
    "grade": ("inferlab.grade", "grade a lab (Gradescope-style results)"),
}


def usage() -> str:
    lines = ["usage: inferlab COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`inferlab COMMAND --help` describes one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"inferlab: error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except (InferlabError, ValueError) as exc:
        print(f"inferlab {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
