"""``inferlab generate``: stream a completion to the terminal, or print one JSON object.

With ``--chat`` the prompt is one user message (after ``--system``, if given), rendered through the
model's chat template and stopped at its end-of-turn token: ``LLM.chat``'s path and the server's
(``inferlab.model.chat``). The context rule is the server's: a request whose prompt plus
``--max-tokens`` does not fit in the model's context (or in the KV pool) is refused with one line,
never silently cut short.
"""
from __future__ import annotations

import argparse
import json
import sys

from inferlab.model.chat import Chat
from inferlab.errors import InferlabError
from inferlab.llm import LLM, step_stats
from inferlab.sampling import SamplingParams
from inferlab.spec.config import SpeculativeConfig


def build_parser() -> argparse.ArgumentParser:
    from inferlab.cli import HelpFormatter, add_quantization_argument

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab generate", description="Complete PROMPT with a model.")
    p.add_argument("prompt", help="the text to complete (with --chat: the user's message)")
    p.add_argument("--model", default="target", help="embedded name, HF folder or hub id (default: target)")
    p.add_argument("--chat", action="store_true", help="send PROMPT as a user message through the model's chat "
                   "template and print the reply, which ends at the template's end-of-turn token")
    p.add_argument("--system", default=None, help="with --chat: a system message before PROMPT (default: none)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="tokens to generate at most; prompt + this must fit the context (default: 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=-1, help="keep the k most likely tokens; -1 = off (default: -1)")
    p.add_argument("--top-p", type=float, default=1.0, help="keep the smallest set with this probability "
                   "(nucleus); 1 = off (default: 1)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling, for reproducible runs (default: none)")
    p.add_argument("--stop", action="append", default=None, help="stop string, repeatable (default: none)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    add_quantization_argument(p)
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="split the model over this many processes, gloo on CPU and NCCL on CUDA (default: 1)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, vLLM\'s dict, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\' '
                   "(default: off)")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, token_ids, finish_reason, "
                   "rates) instead of streaming")
    return p


def check_context(llm: LLM, prompt: str | list[int], max_tokens: int) -> None:
    """The server's rule: prompt (text or token ids) + max_tokens must fit in the context and the KV pool."""
    c = llm.llm_engine.config
    limit = min(c.max_model_len, c.num_kv_blocks * c.block_size)
    if isinstance(prompt, str):
        prompt = llm.tokenizer.encode(prompt) if llm.tokenizer is not None else []
    n = len(prompt)
    if n >= limit:
        raise InferlabError(f"the prompt has {n} tokens, but this model's context is {limit} tokens: "
                            f"shorten the prompt")
    if n + max_tokens > limit:
        raise InferlabError(f"this model's maximum context length is {limit} tokens, but {n + max_tokens} were "
                            f"requested ({n} in the prompt, {max_tokens} to generate): use --max-tokens "
                            f"{limit - n} or less, or shorten the prompt")


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                seed=args.seed, max_tokens=args.max_tokens, stop=args.stop)
        spec = None if args.speculative_config is None else json.loads(args.speculative_config)
        SpeculativeConfig.from_dict(spec)
    except json.JSONDecodeError as exc:
        parser.error(f"--speculative-config is not valid JSON ({exc.msg}): write it as '{{\"method\": \"ngram\", "
                     f"\"num_speculative_tokens\": 3}}'")
    except ValueError as exc:
        parser.error(str(exc))
    if args.system is not None and not args.chat:
        parser.error("--system goes with --chat")
    llm = LLM(model=args.model, device=args.device, max_num_seqs=1, speculative_config=spec,
              quantization=args.quantization, tensor_parallel_size=args.tensor_parallel_size)
    prompt = args.prompt
    if args.chat:  # LLM.chat's path, streamed
        chat = Chat(llm.tokenizer)
        messages = [{"role": "system", "content": args.system}] if args.system is not None else []
        _, prompt = chat.prompt(messages + [{"role": "user", "content": args.prompt}])
        params = chat.sampling_params(params)
    check_context(llm, prompt, args.max_tokens)
    engine = llm.llm_engine
    before = dict(engine.counters)
    engine.add_request("cli", prompt, params)
    if not args.json and not args.chat:
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
        if spec is not None:
            stats.update({k: engine.counters[k] - before[k] for k in before if k.startswith("spec_decode_")})
        print(json.dumps({"text": comp.text, "token_ids": comp.token_ids, "finish_reason": comp.finish_reason,
                          **stats}))
    else:
        sys.stdout.write("\n")
    return 0
