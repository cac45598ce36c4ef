"""The proposer seam of speculative decoding: one interface for every way of guessing tokens.

A proposer takes part in the engine's step at three points (vLLM v1 has the same three: propose
before scheduling, draft after the slots exist, update after sampling):

    propose(running, k)        before scheduling: each decoding sequence gets its guesses
                               (``seq.spec_token_ids``), so the token budget and the KV slots
                               count them. A proposer whose guesses need the reserved slots (a
                               draft model writes K/V there) sets placeholders here.
    fill(out, block_manager)   after scheduling, before the target's forward: write the guesses
                               that needed the slots; returns {scheduled index: q rows [k_i, V]}
                               for exact rejection sampling ({} when the guesses have no q).
    observe(out, ready, emitted, hidden, starts, running)
                               after verification: learn from what was kept (Medusa reads the
                               hidden states of the rows that emitted, EAGLE the features of
                               every kept row: ``needs_hidden`` and ``capture``).

Each proposer keeps its own per-sequence state (a draft model's count of the tokens it has K/V
for, Medusa's guesses waiting for the next step), keyed by ``seq_id`` and dropped when the
sequence leaves ``running``. The guesses themselves live on the sequence only.

Implementations: ``PromptLookupProposer`` here (prompt lookup over the sequence's own tokens, through
any matcher with ``propose(token_ids)``: ``inferlab.spec.ngram``'s, or lab 04's),
``inferlab.engine.draft.DraftProposer``, ``inferlab.engine.medusa.MedusaProposer`` and
``inferlab.engine.eagle.EagleProposer``.
"""
from __future__ import annotations

import abc

import torch

from inferlab.sampling import probs_from_logits


class Proposer(abc.ABC):
    needs_hidden = False  # True: the engine captures the forward's last hidden states for observe
    # A proposer with a distribution over its guesses stops a sequence's chain at the first guess
    # whose chance of being reached and accepted, as the proposer itself sees it, falls below this
    # (0: always k guesses). See ``cut_chain``.
    confidence_threshold = 0.0

    def propose(self, running, k: int) -> None:
        """Give each decoding sequence up to ``k`` guesses, never more than it may still emit
        after the token the verify step adds; the others guess nothing."""
        for seq in running:
            room = seq.max_guesses(k)
            seq.spec_token_ids = self.guess(seq, room) if seq.is_decoding and room > 0 else []

    @abc.abstractmethod
    def guess(self, seq, room: int) -> list[int]:
        """At most ``room`` guesses for the tokens after ``seq``'s last one."""

    def fill(self, out, block_manager) -> dict[int, torch.Tensor]:
        """Guesses that need their reserved slots, and the draft distributions q (default: none)."""
        return {}

    def observe(self, out, ready: list[int], emitted: dict[int, list[int]], hidden: torch.Tensor | None,
                starts: list[int], running) -> None:
        """What the step kept (default: nothing to learn)."""

    def capture(self, model):
        """With ``needs_hidden``: a context manager collecting what ``observe`` gets as ``hidden``
        from the target's forward (default: the final-norm hidden states of the logits rows)."""
        from inferlab.spec.medusa import capture_hidden
        return capture_hidden(model)


def cut_chain(sure: float, logits: torch.Tensor, q: torch.Tensor, token: int, greedy: bool,
              threshold: float) -> tuple[float, torch.Tensor] | None:
    """Does a chain of guesses go on through ``token``? The proposer's own estimate that the chain
    is accepted up to here is ``sure`` (up to the guess before) times the probability it gave
    ``token``: q's, or for a greedy request (whose q is one-hot) the softmax of its raw ``logits``
    (EAGLE-2, Li et al. 2024, ranks its draft tree by this product). A guess pays when the tokens
    it is expected to add, this estimate, exceed what its verify row and its drafting cost in
    plain steps, so that is the threshold to set (about c + v_1 - 1 for a first guess).

    Returns None (stop: the guess is dropped and the target draws that token itself), or the new
    estimate and the q to verify the guess with. Sampling stays exact: a guess is verified only
    when it falls in K = {x: sure * q(x) >= threshold}, so a verified guess is drawn from q
    restricted to K, and that restriction, renormalised, is the q the verifier must use. With it
    the token at this position is p's whether the guess was kept (probability q(K)) or dropped."""
    conf = sure * (logits.float().softmax(-1) if greedy else q)
    if float(conf[token]) < threshold:
        return None
    if not greedy:
        q = torch.where(conf >= threshold, q, 0.0)
        q = q / q.sum()
    return float(conf[token]), q


def draw_guess(logits: torch.Tensor, seq, sure: float, threshold: float) -> tuple[int, torch.Tensor, float] | None:
    """A model proposer's next guess for ``seq`` from its ``logits``: the argmax for a greedy
    request, else a draw from q (the request's own distribution, with its generator). Returns the
    token, the q to verify it with and the chain's new estimate (``cut_chain``), or None where the
    threshold stops the chain."""
    greedy = seq.params.greedy
    q = probs_from_logits(logits, seq.params)
    token = int(q.argmax()) if greedy else int(torch.multinomial(q, 1, generator=seq.generator))
    if threshold > 0:
        going = cut_chain(sure, logits, q, token, greedy, threshold)
        if going is None:
            return None
        sure, q = going
    return token, q, sure


class PromptLookupProposer(Proposer):
    """Prompt lookup (vLLM's ``ngram``): copy what followed the last n tokens earlier in the
    sequence. ``matcher.propose(token_ids)`` finds it (``inferlab.spec.ngram.NgramProposer``)."""

    def __init__(self, matcher):
        self.matcher = matcher

    def guess(self, seq, room: int) -> list[int]:
        return self.matcher.propose(seq.token_ids(0, seq.num_tokens))[:room]
