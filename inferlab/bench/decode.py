"""Single-stream greedy decode: inferlab against transformers ``generate`` on one checkpoint.

All run the same prompt for the same number of new tokens (EOS ignored), after a warm-up,
alternating, best of ``--repeats``: inferlab's engine (``LLM.generate``: scheduler, paged KV
cache), its contiguous-cache reference path (``inferlab.generate``) and transformers. Reported:
new tokens per second of the whole generate call (prefill included) and the ratios.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from inferlab.errors import InferlabError
from inferlab.generate import generate
from inferlab.llm import LLM
from inferlab.loader import resolve_model_path
from inferlab.sampling import SamplingParams

PROMPT = "def fibonacci(n):\n    "


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(model: str = "target", new_tokens: int = 128, repeats: int = 3, device: str | None = None) -> dict:
    try:
        import transformers
    except ImportError:
        raise InferlabError("the decode benchmark compares against transformers: pip install transformers") from None
    llm = LLM(model=model, device=device)
    folder = resolve_model_path(model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=llm.model.dtype).to(llm.model.device).eval()
    ids = llm.encode(PROMPT) if llm.tokenizer else [1, 2, 3, 4, 5]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    hf_ids = torch.tensor([ids], device=llm.model.device)
    pad = llm.eos_token_ids[0] if llm.eos_token_ids else 0

    def ours():
        out = llm.generate(prompt_token_ids=[ids], sampling_params=params)
        assert len(out[0].outputs[0].token_ids) == new_tokens

    def theirs():
        with torch.inference_mode():
            out = hf.generate(hf_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=pad)
        assert out.shape[1] - hf_ids.shape[1] == new_tokens

    def contiguous():
        seq = generate(llm.model, [ids], [params], llm.eos_token_ids, llm.tokenizer)[0]
        assert len(seq.output_token_ids) == new_tokens

    ours(), theirs(), contiguous()  # warm-up
    t_ours, t_hf, t_ref = float("inf"), float("inf"), float("inf")
    for _ in range(repeats):
        t_ours = min(t_ours, _timed(ours))
        t_hf = min(t_hf, _timed(theirs))
        t_ref = min(t_ref, _timed(contiguous))
    return {"model": str(model), "params": llm.model.num_parameters(), "device": str(llm.model.device),
            "dtype": str(llm.model.dtype).removeprefix("torch."), "prompt_tokens": len(ids),
            "new_tokens": new_tokens, "inferlab_tokens_per_s": new_tokens / t_ours,
            "hf_tokens_per_s": new_tokens / t_hf, "ratio": t_hf / t_ours,
            "contiguous_tokens_per_s": new_tokens / t_ref, "engine_vs_contiguous": t_ref / t_ours}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="inferlab bench decode", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="target")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.new_tokens < 1 or args.repeats < 1:
        p.error("--new-tokens and --repeats must be >= 1")
    r = run(args.model, args.new_tokens, args.repeats, args.device)
    if args.json:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))
    else:
        print(f"{r['model']} ({r['params'] / 1e6:.2f}M params, {r['device']} {r['dtype']}), "
              f"{r['new_tokens']} new tokens, greedy, batch 1")
        print(f"{'engine':<14}{'tokens/s':>10}")
        print(f"{'inferlab':<14}{r['inferlab_tokens_per_s']:>10.1f}")
        print(f"{'contiguous':<14}{r['contiguous_tokens_per_s']:>10.1f}  (inferlab's reference path)")
        print(f"{'transformers':<14}{r['hf_tokens_per_s']:>10.1f}")
        print(f"ratio {r['ratio']:.2f}x vs transformers, {r['engine_vs_contiguous']:.2f}x vs the contiguous path")
    return 0
