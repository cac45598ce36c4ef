"""``inferlab generate``: stream a completion to the terminal, or print one JSON object."""
from __future__ import annotations

import argparse
import json
import sys

from inferlab.llm import LLM, step_stats
from inferlab.sampling import SamplingParams


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferlab generate", description="Complete PROMPT with a model.")
    p.add_argument("prompt")
    p.add_argument("--model", default="target", help="embedded name, HF folder or hub id (default: target)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--device", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                seed=args.seed, max_tokens=args.max_tokens, stop=args.stop)
    except ValueError as exc:
        parser.error(str(exc))
    llm = LLM(model=args.model, device=args.device, max_num_seqs=1)
    engine = llm.llm_engine
    before = dict(engine.counters)
    engine.add_request("cli", args.prompt, params)
    if not args.json:
        sys.stdout.write(args.prompt)
    while engine.has_unfinished_requests():
        for out in engine.step():  # streaming: each output carries the new text
            comp = out.outputs[0]
            if not args.json:
                sys.stdout.write(comp.delta_text)
                sys.stdout.flush()
    if args.json:
        rates = step_stats(before, engine.counters, 0.0, 1)
        stats = {k: round(rates[k], 2) for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
        print(json.dumps({"text": comp.text, "token_ids": comp.token_ids, **stats}))
    else:
        sys.stdout.write("\n")
    return 0

