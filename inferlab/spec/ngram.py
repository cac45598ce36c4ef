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
