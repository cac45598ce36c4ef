"""Perplexity with a sliding window: how surprised a model is by text it never trained on.

Perplexity is exp(mean negative log-likelihood per token). A model only sees ``window`` tokens at
once, so a long text is scored window by window. Cutting it into disjoint windows would leave the
first tokens of each window with almost no context; instead the window slides by ``stride``
tokens and only the tokens not scored before are counted:

    tokens:  |----------------------------------------------------|
    window 1 [=========== scored ============]
    window 2              [ context ........ |=== scored ===]
    window 3                           [ context ........ |=== scored ===]

Every token is scored exactly once, and (after the first window) with at least
``window - stride`` tokens of context. A smaller stride costs more forward passes and gives a
slightly lower (better) perplexity. The same passes can compare two models' greedy choices:
the fraction of positions where a draft's argmax equals the target's bounds how many draft
tokens speculative decoding accepts at temperature 0.

**One protocol** for every perplexity inferlab prints (``inferlab models``, ``eval ppl``, ``bench
quant``, ``bench gqa``, the model cards): the corpus' test split, all of it, window
``min(512, context)``, stride ``window // 2``. Each output names the protocol (:func:`protocol`); a
run on fewer tokens says so, since the first tokens of the split are not a fair sample of it (the
mha model scores 41 on the first 40,000 tokens and 63 on all 101,104).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

from inferlab import corpus
from inferlab.errors import InferlabError


def windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_scored) for each window over a stream of ``n`` tokens.

    Token ``i`` is predicted from tokens ``< i``; token 0 has no context and is never scored.
    """
    if not 0 < stride <= window:
        raise InferlabError(f"stride must be in 1..window ({window}), got {stride}")
    overlap = max(1, window - stride)  # context carried into the next window (>= 1 token)
    out, scored_to, begin = [], 1, 0
    while scored_to < n:
        end = min(begin + window, n)
        out.append((begin, end, scored_to))
        scored_to, begin = end, end - overlap
    return out


SPLIT = "test"  # the protocol's split; its window and stride are the defaults of evaluate()


def protocol(res: dict, split: str = SPLIT, total: int | None = None) -> dict:
    """What a perplexity was measured on: split, tokens scored, window, stride (and whether that is
    the whole split, when ``total``, the split's scorable tokens, is given)."""
    out = {"split": split, "tokens": res["tokens"], "window": res["window"], "stride": res["stride"]}
    if total is not None:
        out["whole_split"] = res["tokens"] == total
    return out


def describe(proto: dict) -> str:
    """``test split, all 101,104 tokens, window 512, stride 256`` (the words every output uses)."""
    whole = proto.get("whole_split")
    n = f"{proto['tokens']:,}" if whole is None else f"{'all' if whole else 'first'} {proto['tokens']:,}"
    return f"{proto['split']} split, {n} tokens, window {proto['window']}, stride {proto['stride']}"


@torch.no_grad()
def evaluate(model, ids, window: int | None = None, stride: int | None = None, batch_size: int = 8,
             max_tokens: int | None = None, reference=None, progress: bool = False, desc: str = "perplexity") -> dict:
    """Score a token stream; returns {"ppl", "nll_per_token", "tokens", "window", "stride"} (+
    "agreement" with ``reference``: the fraction of scored positions where both models' argmax
    agree). ``progress``: a bar on stderr, one step per window."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    if max_tokens is not None:
        ids = ids[: max_tokens + 1]
    if len(ids) < 2:
        raise InferlabError("need at least 2 tokens to measure perplexity")
    window = window or min(512, model.config.max_position_embeddings)
    if window > model.config.max_position_embeddings:
        raise InferlabError(f"window {window} exceeds the model's context of {model.config.max_position_embeddings}")
    stride = stride or max(1, window // 2)
    nll, count, agree = 0.0, 0, 0
    spans = windows(len(ids), window, stride)
    by_len: dict[int, list] = {}
    for span in spans:
        by_len.setdefault(span[1] - span[0], []).append(span)
    device = model.device
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(spans), desc=desc, unit="window", leave=False)
    for length, group in by_len.items():
        for i in range(0, len(group), batch_size):
            chunk = group[i:i + batch_size]
            x = torch.stack([ids[b:e] for b, e, _ in chunk]).to(device)
            logits = model(x)[:, :-1].float()
            targets = x[:, 1:]
            ref_logits = reference(x)[:, :-1] if reference is not None else None
            for row, (b, e, first) in enumerate(chunk):
                keep = slice(first - b - 1, e - b - 1)  # logits[j] predicts token b + j + 1
                lg, tg = logits[row, keep], targets[row, keep]
                nll += F.cross_entropy(lg, tg, reduction="sum").item()
                count += tg.numel()
                if ref_logits is not None:
                    agree += (lg.argmax(-1) == ref_logits[row, keep].argmax(-1)).sum().item()
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    out = {"ppl": math.exp(nll / count), "nll_per_token": nll / count, "tokens": count, "window": window,
           "stride": stride}
    if reference is not None:
        out["agreement"] = agree / count
    return out


def test_stream(tokenizer, split: str = "test", max_files: int | None = None) -> np.ndarray:
    """Token ids of one corpus split: each file preceded by ``<|endoftext|>``, as in training."""
    return corpus.token_stream(tokenizer, corpus.load_corpus(split, max_files=max_files))


def build_parser() -> argparse.ArgumentParser:
    from inferlab.cli import HelpFormatter, add_quantization_argument

    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="inferlab eval ppl",
                                description="Perplexity of a model on a split of the stdlib corpus (sliding window).")
    p.add_argument("--model", default="target", help="target, draft, or an HF model folder (default: target)")
    p.add_argument("--split", default=SPLIT, choices=corpus.SPLITS, help=f"corpus split (default: {SPLIT})")
    p.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens of the split "
                   "(default: all of it, as `inferlab models` and the benchmarks do)")
    p.add_argument("--window", type=int, default=None, help="tokens per forward pass (default: min(512, context))")
    p.add_argument("--stride", type=int, default=None, help="tokens the window moves (default: window // 2)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass (default: 8)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    p.add_argument("--dtype", default=None, help="compute dtype (default: float32 on CPU, bf16 on GPU)")
    add_quantization_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    return p


def main(argv: list[str]) -> int:
    from inferlab.device import default_device, parse_dtype
    from inferlab.llm import load_model

    args = build_parser().parse_args(argv)
    if args.max_tokens is not None and args.max_tokens < 1:
        raise InferlabError("--max-tokens must be >= 1")
    device = args.device or default_device()
    model, tok, _ = load_model(args.model, device, parse_dtype(args.dtype, device), args.quantization)
    if tok is None:
        raise InferlabError(f"{args.model} has no tokenizer.json: perplexity needs the model's tokenizer")
    ids = test_stream(tok, args.split)
    res = evaluate(model, ids, args.window, args.stride, args.batch_size, args.max_tokens, progress=True,
                   desc=f"perplexity of {args.model}")
    proto = protocol(res, args.split, len(ids) - 1)
    out = {"model": args.model, "ppl": round(res["ppl"], 4), "nll_per_token": round(res["nll_per_token"], 5),
           "tokens": res["tokens"], "ppl_protocol": proto}
    if args.quantization is not None:
        out["quantization"] = args.quantization
    if args.json:
        print(json.dumps(out))
    else:
        name = args.model if args.quantization is None else f"{args.model} ({args.quantization})"
        print(f"{name}: perplexity {out['ppl']:.3f} ({out['nll_per_token']:.4f} nats/token; {describe(proto)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
