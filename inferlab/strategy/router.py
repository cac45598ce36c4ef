"""Routing between a small and a large model: easy requests to the small one, the rest to the large.

The signal must be cheap: here the small model's mean negative log-likelihood (NLL) on the
prompt, one prefill of the small model. A prompt the small model finds predictable is likely
one it can continue well; a surprising one goes to the large model. ``route`` is that rule;
``sweep`` moves the threshold and prices each point with costs *measured* on the engine
(``cost_per_token``) and quality measured against the large model: perplexity of the true
continuation and agreement with the large model's next-token choices.

RouteLLM (Ong et al., 2024) learns the router from preference data and reports 35-85% cost saved
at 95% of GPT-4's quality, where the small model answers most everyday questions almost as well.
Our pair is a code model of 5.6M parameters and a draft of 0.9M trained on much less: the draft's
perplexity is 2.5x the target's, so far fewer requests can move without losing quality.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from inferlab.sampling import SamplingParams


def to_small(score, threshold):
    """The routing rule, in one place: the small model takes a request when its prompt NLL is at most
    ``threshold`` (it finds the prompt easy). Works on one score or an array of them (a bool mask)."""
    return score <= threshold


def route(score: float, threshold: float) -> str:
    """"small" or "large" for one request (``to_small``): the call the capstone makes per request."""
    return "small" if to_small(score, threshold) else "large"


class CodeCorpus:
    """One split of the stdlib corpus as token lists, tokenized once, when made: make one and pass
    it to :func:`code_requests` as often as needed (a tokenizer passed there is tokenized anew)."""

    def __init__(self, tokenizer, split: str = "test"):
        from inferlab import corpus

        self.split = split
        self.streams: list[list[int]] = [tokenizer.encode(f.text) for f in corpus.load_corpus(split)]


def code_requests(source, n: int, prompt_len: int = 48, continuation_len: int = 32, split: str = "test",
                  seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``n`` (prompt, true continuation) token pairs cut at seeded places from the stdlib corpus's
    ``split``. ``source``: a :class:`CodeCorpus` of that split, or a tokenizer to make one with."""
    corpus = source if isinstance(source, CodeCorpus) else CodeCorpus(source, split)
    if corpus.split != split:
        raise ValueError(f"this CodeCorpus holds the {corpus.split!r} split, not {split!r}")
    rng = np.random.default_rng(seed)
    streams = [s for s in corpus.streams if len(s) > prompt_len + continuation_len]
    out = []
    for i in range(n):
        s = streams[int(rng.integers(len(streams)))]
        start = int(rng.integers(len(s) - prompt_len - continuation_len))
        out.append((s[start:start + prompt_len], s[start + prompt_len:start + prompt_len + continuation_len]))
    return out


@torch.inference_mode()
def score_requests(small, large, requests) -> dict:
    """Teacher-forced over prompt + continuation, one batch per model: the small model's mean prompt
    NLL (the routing signal), each model's mean NLL on the continuation, and the fraction of
    continuation positions where the small model's argmax equals the large model's."""
    p = len(requests[0][0])
    x = torch.tensor([a + b for a, b in requests], device=small.device)
    out = {}
    for name, model in (("small", small), ("large", large)):
        logits = model(x)[:, :-1].float()
        nll = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")  # [B, T-1]
        out[f"{name}_prompt_nll"] = nll[:, :p - 1].mean(1).cpu().numpy()
        out[f"{name}_nll"] = nll[:, p - 1:].mean(1).cpu().numpy()
        out[f"{name}_argmax"] = logits[:, p - 1:].argmax(-1)
    out["agreement"] = (out.pop("small_argmax") == out.pop("large_argmax")).float().mean(1).cpu().numpy()
    out["score"] = out["small_prompt_nll"]
    return out


def sweep(table: dict, thresholds, cost_small: float, cost_large: float, scoring_cost: float = 0.0,
          score: np.ndarray | None = None) -> list[dict]:
    """For each threshold: the share routed small, the cost relative to sending everything large
    (the scoring prefill included), perplexity of the mix, its quality (large ppl / mix ppl) and its
    agreement with the large model (1 on requests the large model serves). ``score`` replaces the
    routing signal (e.g. the oracle gap, for an upper bound)."""
    s = table["score"] if score is None else score
    ns, nl = table["small_nll"], table["large_nll"]
    n = len(s)
    ppl_large = math.exp(float(nl.mean()))
    rows = []
    for t in thresholds:
        small = to_small(s, t)
        cost = (small.sum() * cost_small + (~small).sum() * cost_large + n * scoring_cost) / (n * cost_large)
        ppl = math.exp(float(np.where(small, ns, nl).mean()))
        rows.append({"threshold": float(t), "small_share": float(small.mean()), "cost": float(cost),
                     "saved": 1 - float(cost), "ppl": ppl, "quality": ppl_large / ppl,
                     "agreement": float(np.where(small, table["agreement"], 1.0).mean())})
    return rows


def best_saving(rows: list[dict], min_quality: float = 0.95) -> dict | None:
    """The cheapest point of a sweep whose quality is at least ``min_quality``."""
    ok = [r for r in rows if r["quality"] >= min_quality]
    return min(ok, key=lambda r: r["cost"]) if ok else None


def cost_per_token(llm, prompts: list[list[int]], max_tokens: int = 32, repeats: int = 3) -> float:
    """Seconds per generated token of ``llm`` on the engine, greedy with ``max_tokens`` per prompt
    (prefill included): the best of ``repeats`` runs. Compare models in one process, never across runs."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm.generate(prompt_token_ids=prompts, sampling_params=params)
        best = min(best, (time.perf_counter() - t0) / (len(prompts) * max_tokens))
    return best
