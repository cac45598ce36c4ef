"""Lab 04: speculative decoding. Write the three pieces marked TODO.

A proposer guesses the next k tokens cheaply; the target model scores all k + 1 positions in one
forward; the verifier keeps a prefix of the guesses and adds one token of its own. Done right,
the tokens that come out follow exactly the target's distribution (Leviathan et al. 2023; Chen et
al. 2023), however bad the guesses are.

1. ``NgramProposer.propose``: prompt lookup (Saxena 2023). Find the last n tokens earlier in the
   sequence and guess what followed them there. Try n = prompt_lookup_max first, then shorter,
   down to prompt_lookup_min (never n >= len(token_ids)); for the first n that matches, take the
   MOST RECENT earlier occurrence (it must start before the suffix itself; it may overlap it) and
   return up to num_speculative_tokens tokens that followed it (fewer if the sequence ends first).
   No match for any n: return [].

2. ``recovered_probs(p, q)``: what a rejection samples from, row by row: max(0, p - q),
   normalised to sum to 1. A row where that is all zero (p <= q everywhere) gives p itself.

3. ``rejection_sample``: verify every sequence's guesses in one call. Sequence i guessed
   ``draft_token_ids[i]`` (k_i tokens, maybe 0). ``target_probs`` holds each sequence's k_i + 1
   rows one after the other (vLLM's flat layout): row j < k_i is p at guess j, row k_i is p after
   the last guess. ``draft_probs`` holds each sequence's k_i rows of q in the same way, or is None
   for a proposer with no distribution (n-gram): then treat q as one-hot at the guess (q(x) = 1).
   For each sequence, walk its guesses left to right:
     - accept guess x (row j) when u < p_j(x) / q_j(x), u = uniforms[i, j] (or a fresh uniform
       draw when ``uniforms`` is None); write it u * q < p, no division;
     - at the first rejection, stop: the last token comes from recovered_probs(p_j, q_j);
     - if every guess was accepted, the last token comes from the bonus row p_{k_i}.
   Draw every sequence's last token with ``draw(rows, generators)`` (imported below): ``rows`` is
   [B, V], one distribution per sequence, ``generators`` a list of B (None or torch.Generator).
   One call for the batch or one per sequence both work; the grader watches these calls to
   enumerate your verifier's output distribution exactly, so draw the last token with it.
   Return one list per sequence: the accepted guesses, then the drawn token.

Grade your work with `inferlab grade labs/04_speculative_decoding`. Keep the names and signatures.
"""
from __future__ import annotations

import torch

from inferlab.sampling import draw  # draw(probs [B, V], generators) -> tokens [B]: the last token of each sequence


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 3):
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: list[int]) -> list[int]:
        """Up to num_speculative_tokens guesses for what follows ``token_ids`` ([] if no match)."""
        # TODO: for n from min(prompt_lookup_max, len(token_ids) - 1) down to prompt_lookup_min:
        #       suffix = token_ids[-n:]; find the largest start i < len(token_ids) - n with
        #       token_ids[i:i + n] == suffix; if found, return token_ids[i + n:i + n + k].
        raise NotImplementedError("about 8 lines")


def recovered_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) for each row of p, q [B, V]; p itself where that row is all zero."""
    # TODO: clamp p - q at 0, divide by the row sums; use torch.where to fall back to p.
    raise NotImplementedError("about 3 lines")


def rejection_sample(draft_token_ids: list[list[int]], target_probs: torch.Tensor,
                     draft_probs: torch.Tensor | None = None, generators: list | None = None,
                     uniforms: torch.Tensor | None = None) -> list[list[int]]:
    """Each sequence's emitted tokens: its accepted guesses, then one token drawn with draw()."""
    # TODO: for each sequence i (keep a row offset into target_probs and one into draft_probs):
    #         walk its guesses; p_j = target_probs[row + j], q_j = draft_probs[q_row + j] or one-hot;
    #         accept while u * q_j[x] < p_j[x]; remember the row the last token comes from
    #         (recovered_probs(p_j, q_j) at a rejection, else the bonus row);
    #       draw all the last tokens with draw(torch.stack(rows), generators or [None] * B).
    raise NotImplementedError("about 25 lines")
