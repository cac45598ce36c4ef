"""MHA vs GQA vs MQA at one model size: KV bytes per token, sequences per KV budget, decode speed
and perplexity.

The variants are the embedded ``mha`` model (the draft's shape, 4 K/V heads) and its conversions
to GQA (2 K/V heads) and MQA (1), by mean-pooling K/V heads (Ainslie et al. 2023): each
measured right after pooling and after a short uptraining (the shipped ``gqa`` and ``mqa``,
5% of the MHA model's training steps).

Decode speed: batched greedy decode of ``--batch`` sequences with ``--context`` tokens of prompt,
all variants in one process, alternating, best of ``--repeats``; reported as tokens/s and as a
ratio to MHA. On a CPU and a model this small the attention over the cache is a small share of
a step, so the ratio says how much of a step K/V reading is at this size.

Perplexity follows the one protocol of :mod:`inferlab.eval.ppl` (the whole test split unless
``--eval-tokens``), so the mha row equals ``inferlab models`` and ``inferlab eval ppl --model mha``.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from inferlab.errors import InferlabError
from inferlab.model.gqa import kv_bytes_per_token, max_seqs_in_budget, mean_pool_kv_heads


def _decode_time(model, prompts, new_tokens: int) -> float:
    from inferlab.llm import LLM
    from inferlab.sampling import SamplingParams

    llm = LLM.from_model(model, max_num_seqs=len(prompts))
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    t = time.perf_counter()
    llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return time.perf_counter() - t


def variants(device: str = "cpu") -> list[tuple[str, object]]:
    """(name, model) for MHA, then GQA and MQA mean-pooled and uptrained."""
    from inferlab.model.loader import ASSETS, load_checkpoint

    if not (ASSETS / "mha" / "config.json").exists():
        raise InferlabError("the embedded mha model is not built: run `inferlab train --models mha --steps 900`")
    mha, tok = load_checkpoint("mha", device=device)
    out = [("mha", mha)]
    for kv, name in ((2, "gqa"), (1, "mqa")):
        out.append((f"{name}_mean_pooled", mean_pool_kv_heads(mha, kv)))
        if (ASSETS / name / "config.json").exists():
            out.append((f"{name}_uptrained", load_checkpoint(name, device=device)[0]))
    return out, tok


def run(kv_budget_mb: float = 64, context: int = 256, batch: int = 8, new_tokens: int = 32, repeats: int = 3,
        eval_tokens: int | None = None, device: str | None = None, progress: bool = True) -> dict:
    """``progress``: one bar on stderr over the decode timings and the perplexity runs."""
    from tqdm.auto import tqdm

    from inferlab.device import default_device
    from inferlab.eval.ppl import evaluate, protocol, test_stream

    device = device or str(default_device())
    models, tok = variants(device)
    bar = tqdm(total=len(models) * (repeats + 2), desc="bench gqa", unit="run", **({} if progress else {"disable": True}))  # TQDM_DISABLE still applies
    ids = test_stream(tok)
    gen = torch.Generator().manual_seed(0)
    prompts = [ids[s:s + context].tolist() for s in torch.randint(0, len(ids) - context, (batch,), generator=gen)]
    seq_len = models[0][1].config.max_position_embeddings
    best = {n: float("inf") for n, _ in models}
    for n, model in models:
        bar.set_postfix_str(f"warm-up {n}")
        _decode_time(model, prompts, 2)  # warm-up
        bar.update()
    for r in range(repeats):
        for n, model in models:
            bar.set_postfix_str(f"decode {n} ({r + 1}/{repeats})")
            best[n] = min(best[n], _decode_time(model, prompts, new_tokens))
            bar.update()
    rows = []
    for name, model in models:
        cfg = model.config
        bar.set_postfix_str(f"perplexity {name}")
        res = evaluate(model, ids, max_tokens=eval_tokens, progress=progress, desc=f"perplexity {name}")
        bar.update()
        rows.append({"name": name, "num_kv_heads": cfg.num_key_value_heads, "kv_bytes_per_token": kv_bytes_per_token(cfg),
                     "max_seqs_in_kv_budget": max_seqs_in_budget(cfg, int(kv_budget_mb * 2**20), seq_len),
                     "decode_tokens_per_s": round(batch * new_tokens / best[name], 1),
                     "decode_speed_vs_mha": round(best["mha"] / best[name], 3), "ppl": round(res["ppl"], 3)})
    bar.close()
    return {"kv_budget_mb": kv_budget_mb, "seq_len": seq_len, "batch": batch, "context": context,
            "new_tokens": new_tokens, "ppl_tokens": res["tokens"], "ppl_protocol": protocol(res, total=len(ids) - 1),
            "fields": {"decode_speed_vs_mha": "decode tokens/s of the variant / decode tokens/s of mha",
                       "max_seqs_in_kv_budget": "sequences of seq_len tokens whose fp16 K/V fit in kv_budget_mb"},
            "device": device, "variants": rows}


def main(argv: list[str]) -> int:
    from inferlab.cli import HelpFormatter

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab bench gqa", description=__doc__.splitlines()[0])
    p.add_argument("--kv-budget-mb", type=float, default=64, help="KV memory budget for max_seqs_in_kv_budget, "
                   "fp16 cache (default: 64)")
    p.add_argument("--context", type=int, default=256, help="prompt tokens per sequence in the decode timing (default: 256)")
    p.add_argument("--batch", type=int, default=8, help="sequences decoded together (default: 8)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per timing (default: 32)")
    p.add_argument("--repeats", type=int, default=3, help="timings per variant, best kept (default: 3)")
    p.add_argument("--eval-tokens", type=int, default=None, help="score only the first N test tokens, faster but "
                   "not comparable with `inferlab models` (default: the whole test split)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    args = p.parse_args(argv)
    if min(args.context, args.batch, args.new_tokens, args.repeats, args.eval_tokens or 1) < 1 or args.kv_budget_mb <= 0:
        p.error("--context, --batch, --new-tokens, --repeats, --eval-tokens and --kv-budget-mb must be positive")
    from inferlab.eval.ppl import describe

    r = run(args.kv_budget_mb, args.context, args.batch, args.new_tokens, args.repeats, args.eval_tokens, args.device)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"KV budget {r['kv_budget_mb']:g} MiB of fp16 cache, sequences of {r['seq_len']} tokens; decode: batch "
          f"{r['batch']}, {r['context']}-token prompts, {r['new_tokens']} new tokens")
    print(f"perplexity: {describe(r['ppl_protocol'])}")
    print(f"{'variant':<24}{'kv heads':>9}{'KV B/token':>11}{'max seqs':>9}{'tok/s':>9}{'vs MHA':>8}{'ppl':>9}")
    for v in r["variants"]:
        print(f"{v['name']:<24}{v['num_kv_heads']:>9}{v['kv_bytes_per_token']:>11,}{v['max_seqs_in_kv_budget']:>9}"
              f"{v['decode_tokens_per_s']:>9.1f}{v['decode_speed_vs_mha']:>7.2f}x{v['ppl']:>9.2f}")
    return 0
