"""Log-probabilities of tokens, shaped as vLLM returns them.

``SamplingParams(logprobs=N)`` gives, for each generated token, a dict ``{token_id: Logprob}``:
the sampled token first (its log-probability and its rank in the vocabulary, 1 = most likely),
then the N most likely tokens (``SampleLogprobs``, one dict per token). ``prompt_logprobs=N``
gives the same for every prompt token but the first, which nothing predicts (``PromptLogprobs``:
None, then one dict per token).

Which distribution (vLLM's ``logprobs_mode``, an engine knob):

* ``"raw_logprobs"``, vLLM V1's default and ours: ``log_softmax`` of the model's logits as they
  come out of the lm_head, before temperature, top-k and top-p. A token's log-probability then
  depends only on the model and the context, not on how the request samples: what an evaluation
  harness scores, and the same number whatever the temperature.
* ``"processed_logprobs"``: the distribution the sampler draws from, after temperature, top-k and
  top-p (tokens they remove get -inf). A greedy request (temperature 0) is not scaled, so its
  processed log-probs are the raw ones, as in vLLM.

Under speculative decoding every emitted token is scored on the *target's* logits at its
position (the rows the verifier read), never on the draft's q. Prompt log-probs are always raw,
as in vLLM. Nothing here runs unless a request asks: the engine calls it on the rows of those
requests only.
"""
from __future__ import annotations

import dataclasses

import torch

from inferlab.sampling import SamplingParams, filter_logits

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
MAX_LOGPROBS = 20  # vLLM's default max_logprobs (and OpenAI's cap on top_logprobs)


@dataclasses.dataclass
class Logprob:
    """vLLM's ``Logprob``: a token's log-probability, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


def log_probs(logits: torch.Tensor, params: list[SamplingParams] | None = None,
              mode: str = "raw_logprobs") -> torch.Tensor:
    """Log-probabilities [R, V] of ``logits`` [R, V] under ``mode``; ``params`` (one per row) are
    needed for ``"processed_logprobs"`` only."""
    if mode == "raw_logprobs" or params is None:
        return logits.float().log_softmax(-1)
    rows = [row if p.greedy else filter_logits(row, p.temperature, p.top_k, p.top_p)
            for row, p in zip(logits.float(), params)]
    return torch.stack(rows).log_softmax(-1)


def token_logprobs(logprobs: torch.Tensor, token_ids: list[int], num_top: list[int],
                   tokenizer=None) -> list[dict[int, Logprob]]:
    """One dict per row of ``logprobs`` [R, V]: ``token_ids[r]`` with its rank, then the row's
    ``num_top[r]`` most likely tokens (vLLM's order: the chosen token first; a top token that is
    the chosen one is not repeated)."""
    ids = torch.tensor(token_ids, device=logprobs.device)[:, None]
    chosen = logprobs.gather(1, ids)
    ranks = (logprobs > chosen).sum(-1) + 1  # strictly more likely tokens, plus one
    k = max(num_top, default=0)
    top_vals, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
    chosen, ranks, top_vals, top_ids = chosen[:, 0].tolist(), ranks.tolist(), top_vals.tolist(), top_ids.tolist()
    out = []
    for r, tok in enumerate(token_ids):
        entry = {tok: Logprob(chosen[r], ranks[r], _decode(tokenizer, tok))}
        for i in range(num_top[r]):
            t = top_ids[r][i]
            if t not in entry:
                entry[t] = Logprob(top_vals[r][i], i + 1, _decode(tokenizer, t))
        out.append(entry)
    return out


def _decode(tokenizer, token_id: int) -> str | None:
    """One token's text, special tokens included (a byte-level BPE token that is part of a
    character decodes to U+FFFD, as in vLLM)."""
    return None if tokenizer is None else tokenizer.decode([token_id], skip_special_tokens=False)
