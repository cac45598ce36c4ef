"""Prompt lookup (Saxena 2023; vLLM's ``ngram`` method): guess the next tokens by finding the
last n tokens earlier in the sequence and copying what followed them there.

No model, no distribution: the verifier treats the guesses as deterministic (q one-hot). It pays
where text repeats itself: code that reuses names, edits of a prompt, extraction and summaries.
Longer matches are tried first (they predict better); among equal lengths the most recent
occurrence wins (the nearest context is usually the most relevant).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class NgramProposer:
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3

    def __post_init__(self):
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")

    def propose(self, token_ids) -> list[int]:
        """Up to ``num_speculative_tokens`` guesses for what follows ``token_ids`` ([] if no
        earlier occurrence of its last ``prompt_lookup_min`` tokens exists)."""
        tokens = np.asarray(token_ids, dtype=np.int64)
        n_tok = len(tokens)
        for n in range(min(self.prompt_lookup_max, n_tok - 1), self.prompt_lookup_min - 1, -1):
            suffix = tokens[n_tok - n:]
            # Every window of length n that starts before the suffix and has a token after it.
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:n_tok - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            hits = hits[hits < n_tok - n]
            if len(hits):
                start = int(hits[-1]) + n
                return tokens[start:start + self.num_speculative_tokens].tolist()
        return []


def copy_ceiling(prompts, outputs, k: int) -> float:
    """The most any proposer that copies from the context could save on these answers: plain
    decoding's decode steps over those of a lookup that knew each answer in advance and, at every
    step, copied the longest run of the next tokens (at most ``k``) found anywhere in the context
    (prompt and answer so far), each verify keeping the whole run plus the target's own token.

    A count, not a timing: it bounds the speedup of prompt lookup (and of suffix-tree lookups
    such as SuffixDecoding's) at this k even if a verify cost no more than a plain step. Taking the
    longest run at each step is optimal over the whole answer: a run found at position i still
    holds, one shorter, at i + 1, so being further ahead never leaves fewer tokens to copy."""
    plain = steps = 0
    for prompt, out in zip(prompts, outputs):
        ctx = np.asarray(list(prompt) + list(out), dtype=np.int64)
        start, j = len(prompt), 1  # the first answer token comes from the prefill
        plain += max(len(out) - 1, 0)
        while j < len(out):
            end = start + j  # the context: prompt and out[:j]
            want = ctx[end:end + min(k, len(out) - j)]
            run = 0
            for p in np.flatnonzero(ctx[:end] == want[0]):
                n = 1
                while n < len(want) and p + n < end and ctx[p + n] == want[n]:
                    n += 1
                run = max(run, n)
            j += min(run + 1, len(out) - j)
            steps += 1
    return plain / max(steps, 1)
