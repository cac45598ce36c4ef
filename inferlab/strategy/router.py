"""Routing between a small and a large model: easy requests to the small one, the rest to the large.

The signal must be cheap: here the small model's mean negative log-likelihood (NLL) on the
prompt, one prefill of the small model. A prompt the small model finds predictable is likely
one it can continue well; a surprising one goes to the large model. ``route`` is that rule;
``sweep`` moves the threshold and prices each point with costs *measured* on the engine
(``cost_per_token``) and quality measured against the large model: perplexity of the true
continuation and agreement with the large model's next-token choices.

RouteLLM (Ong et al., 2024) learns the router from preference data and reports 35-85% cost saved
at 95% of GPT-4's quality, where the small model answers most everyday questions almost as well.
Notebook 07 prices smollm2 against its 3-layer draft on the FAQ's written answers
(``questions.faq_requests``): the draft's perplexity there is hundreds of times smollm2's, so
nothing can move without losing quality. The embedded code pair (``code_requests``: its draft's perplexity is
about 2.85x the target's) is what lab 07 grades a threshold on.
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


def _shared_prefix(requests) -> int:
    """How many leading prompt tokens every request has in common (at most the earliest scored one)."""
    first = requests[0][0]
    n = min(len(r[0]) for r in requests)
    for r in requests[1:]:
        n = next((i for i, (a, b) in enumerate(zip(first[:n], r[0][:n])) if a != b), n)
    return max(0, min([n] + [r[2] - 1 if len(r) > 2 else 0 for r in requests]))


@torch.inference_mode()
def token_nlls(model, requests, batch_size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Teacher-forced over each request's prompt + continuation: per request, the NLL of every token
    from ``start`` on (the prompt's ``start``-th token: the third element of a triple, else 1) and the
    model's argmax at those positions. The prefix all requests share is run once and its K/V
    copied to every row (what prefix caching does in the engine); the rest is right-padded, which a
    causal model never sees."""
    from inferlab.attention import AttentionMetadata
    from inferlab.cache import ContiguousKVCache

    shared, dev = _shared_prefix(requests), model.device
    cfg = model.config
    longest = max(len(r[0]) + len(r[1]) for r in requests)
    if shared:
        one = ContiguousKVCache.for_model(cfg, 1, shared, torch.float32, dev)
        model(torch.tensor([requests[0][0][:shared]], device=dev),
              AttentionMetadata(positions=torch.arange(shared, device=dev)[None], kv_cache=one))
    out = []
    for i in range(0, len(requests), batch_size):
        chunk = requests[i:i + batch_size]
        rows = [r[0][shared:] + r[1] for r in chunk]
        t = max(len(x) for x in rows)
        x = torch.zeros(len(chunk), t, dtype=torch.long)
        for j, row in enumerate(rows):
            x[j, :len(row)] = torch.tensor(row)
        cache = ContiguousKVCache.for_model(cfg, len(chunk), longest, torch.float32, dev)
        if shared:
            cache.k[:, :, :, :shared] = one.k
            cache.v[:, :, :, :shared] = one.v
        meta = AttentionMetadata(positions=torch.arange(shared, shared + t, device=dev).expand(len(chunk), t),
                                 kv_cache=cache, cache_start=shared)
        # position k predicts the token at absolute position shared + k + 1; the head (49,152 rows on
        # smollm2) runs only from the first position any row of the chunk scores
        firsts = [(r[2] if len(r) > 2 else 1) - shared - 1 for r in chunk]
        lo = min(firsts)
        logits = model(x.to(dev), meta, logits_indices=torch.arange(lo, t - 1, device=dev)).float()
        nll = F.cross_entropy(logits.transpose(1, 2), x[:, lo + 1:].to(dev), reduction="none")
        for j, first in enumerate(firsts):
            end = len(rows[j]) - 1
            out.append((nll[j, first - lo:end - lo], logits[j, first - lo:end - lo].argmax(-1)))
    return out


def score_requests(small, large, requests, batch_size: int = 8) -> dict:
    """Teacher-forced over prompt + continuation: the small model's mean prompt NLL (the routing
    signal), each model's mean NLL on the continuation, and the fraction of continuation positions
    where the small model's argmax equals the large model's. ``requests``: (prompt, continuation)
    token lists (the signal reads the prompt from its second token), or (prompt, continuation,
    start) triples whose signal reads ``prompt[start:]`` (``questions.faq_requests``)."""
    out = {}
    for name, model in (("small", small), ("large", large)):
        rows = token_nlls(model, requests, batch_size)
        split = [len(r[0]) - (r[2] if len(r) > 2 else 1) for r in requests]  # prompt tokens scored
        out[f"{name}_prompt_nll"] = np.array([float(n[:k].mean()) for (n, _), k in zip(rows, split)])
        out[f"{name}_nll"] = np.array([float(n[k:].mean()) for (n, _), k in zip(rows, split)])
        out[f"{name}_argmax"] = [a[k:] for (_, a), k in zip(rows, split)]
    out["agreement"] = np.array([float((a == b).float().mean())
                                 for a, b in zip(out.pop("small_argmax"), out.pop("large_argmax"))])
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
