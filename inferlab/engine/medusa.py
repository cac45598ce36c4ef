"""The Medusa proposer inside the engine (Cai et al. 2024; vLLM's ``medusa`` method).

Medusa needs no draft forward at all: the heads read the hidden state the target already
computed. In a step, the row whose logits gave a sequence's last emitted token (the bonus token,
or the one drawn at the first rejection) holds h_t; head i on h_t guesses the token i places past
it. So after verification the engine hands the proposer those rows' hidden states, captured from
the same forward (``inferlab.spec.medusa.capture_hidden``), the heads guess for every ready
sequence in one batched call, and the guesses wait on the proposer until the next step's
``propose`` (before scheduling, like n-gram guesses: the scheduler counts them in the budget).

A guess is only a guess: stale ones (a sequence that was preempted, forked or not yet
decoding) cost acceptance, never correctness, since the verifier checks every one. Guesses are
argmax choices with no distribution q, so sampled requests use the deterministic-draft rule.
"""
from __future__ import annotations

import torch

from inferlab.engine.proposer import Proposer
from inferlab.errors import InferlabError
from inferlab.quant.quantize import quantize_like_target
from inferlab.spec.medusa import load_heads


class MedusaProposer(Proposer):
    needs_hidden = True  # the heads read the verify forward's hidden states

    def __init__(self, target, heads_folder, num_speculative_tokens: int, confidence_threshold: float = 0.0):
        self.target = target
        self.confidence_threshold = confidence_threshold
        # blocks in Q8_0 when the target's linears are quantized: the heads' bytes set c
        self.heads = quantize_like_target(load_heads(heads_folder, target.config.hidden_size, target.device,
                                                     target.dtype), target)
        if num_speculative_tokens > self.heads.num_heads:
            raise InferlabError(f"num_speculative_tokens={num_speculative_tokens} but the Medusa heads in "
                                f"{heads_folder} are {self.heads.num_heads}: each head guesses one position, "
                                f"so use k <= {self.heads.num_heads} (or train more with `inferlab train medusa "
                                "--num-heads N`)")
        self.k = num_speculative_tokens
        self.guesses: dict[int, tuple[int, list[int]]] = {}  # seq_id -> (num_tokens when guessed, guesses)

    def guess(self, seq, room: int) -> list[int]:
        """The guesses made when ``seq`` last emitted, if it has not changed since ([] otherwise)."""
        n, guesses = self.guesses.get(seq.seq_id, (-1, []))
        return list(guesses[:room]) if n == seq.num_tokens else []

    def observe(self, out, ready: list[int], emitted: dict[int, list[int]], hidden: torch.Tensor,
                starts: list[int], running) -> None:
        """Guess for every ready, unfinished sequence from ``hidden`` [rows, H] (the step's logits
        rows): sequence j's last emitted token came from row starts[j] + len(emitted[j]) - 1."""
        live = {seq.seq_id for seq in running}
        self.guesses = {sid: g for sid, g in self.guesses.items() if sid in live}
        keep = [j for j in ready if not out.scheduled[j].seq.is_finished]
        if not keep:
            return
        rows = torch.tensor([starts[j] + len(emitted[j]) - 1 for j in keep], device=hidden.device)
        if self.confidence_threshold > 0:
            guesses, probs = self.heads.propose(hidden[rows], self.target.lm_head, self.k, with_probs=True)
            # the chain's confidence after each guess (cut_chain's product, for all at once): it
            # only falls along the chain, so the guesses it keeps are a prefix
            lengths = (probs.double().cumprod(-1) >= self.confidence_threshold).sum(-1).tolist()
        else:
            guesses, lengths = self.heads.propose(hidden[rows], self.target.lm_head, self.k), [self.k] * len(keep)
        for j, g, n in zip(keep, guesses.tolist(), lengths):
            seq = out.scheduled[j].seq
            self.guesses[seq.seq_id] = (seq.num_tokens, g[:n])
