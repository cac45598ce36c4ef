"""Speculative decoding for one sequence on the contiguous cache (gpt-fast's ``speculative_decode``).

The simple reference the engine's speculative mode is checked against, and the loop the lesson
reads first. Each step:

1. the proposer guesses k tokens: prompt lookup copies them, a draft model samples them one by
   one from its own distribution q (its own contiguous cache), Medusa heads read them off the
   hidden state the previous forward left (Cai et al. 2024);
2. the target runs one forward over [last committed token, guess_1..guess_k] (k+1 queries over
   the cached context) and gives p at every position;
3. ``rejection_sample`` keeps a prefix of the guesses and adds one token;
4. rollback is free on a contiguous cache: the next forward simply writes from the first slot
   that holds a rejected token, and attention never reads past the tokens it is given.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from inferlab.attention import AttentionMetadata
from inferlab.cache import ContiguousKVCache
from inferlab.sampling import SamplingParams, make_generator, probs_from_logits
from inferlab.sequence import Sequence, SequenceStatus
from inferlab.spec.medusa import MedusaGuesser, capture_hidden
from inferlab.spec.rejection import greedy_verify, rejection_sample


@dataclasses.dataclass
class SpecStats:
    steps: int = 0             # verify forwards
    proposed: int = 0          # guesses made
    accepted: int = 0          # guesses accepted
    emitted: int = 0           # tokens appended (accepted + one per step, cut at a stop)
    target_s: float = 0.0      # time in target forwards (prefill excluded)
    draft_s: float = 0.0       # time in the proposer
    prefill_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.proposed, 1)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify step (vLLM's mean acceptance length: accepted + the one it adds)."""
        return self.emitted / max(self.steps, 1)


def _forward(model, tokens: list[int], cache, start: int) -> torch.Tensor:
    """Logits [len(tokens), V] for ``tokens`` written at cache slots start.. (positions = slots)."""
    ids = torch.tensor([tokens], device=model.device)
    pos = torch.arange(start, start + len(tokens), device=model.device)[None]
    return model(ids, AttentionMetadata(positions=pos, kv_cache=cache, cache_start=start))[0]


class DraftModelProposer:
    """A smaller model sharing the target's tokenizer; keeps its own contiguous cache."""

    def __init__(self, draft, num_speculative_tokens: int):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.model, self.k = draft, num_speculative_tokens
        self.cache, self.cached = None, 0  # tokens of the sequence whose K/V the draft holds

    def start(self, total_len: int) -> None:
        cfg = self.model.config
        self.cache = ContiguousKVCache.for_model(cfg, 1, total_len, self.model.dtype, self.model.device)
        self.cached = 0

    def propose(self, tokens: list[int], params: SamplingParams, gen) -> tuple[list[int], torch.Tensor]:
        """k guesses and their q rows [k, V]; feeds the draft what it has not seen yet first."""
        logits = _forward(self.model, tokens[self.cached:], self.cache, self.cached)[-1]
        guesses, qs = [], []
        for j in range(self.k):
            q = probs_from_logits(logits, params)
            tok = int(q.argmax()) if params.greedy else int(torch.multinomial(q, 1, generator=gen))
            guesses.append(tok)
            qs.append(q)
            if j + 1 < self.k:  # the last guess is never fed: its K/V would only matter if kept
                logits = _forward(self.model, [tok], self.cache, len(tokens) + j)[-1]
        self.cached = len(tokens) + self.k - 1
        return guesses, torch.stack(qs)

    def rollback(self, num_committed: int) -> None:
        """Forget cached tokens past the committed ones (their slots are overwritten later)."""
        self.cached = min(self.cached, num_committed)


@torch.inference_mode()
def speculative_generate(target, prompt_ids: list[int], params: SamplingParams, proposer,
                         eos_token_ids=(), tokenizer=None) -> tuple[Sequence, SpecStats]:
    """Generate one sequence with ``proposer`` (``NgramProposer``, ``DraftModelProposer`` or
    ``inferlab.spec.medusa.MedusaGuesser``)."""
    if not prompt_ids:
        raise ValueError("empty prompt: give at least one token")
    k = proposer.k if isinstance(proposer, DraftModelProposer) else proposer.num_speculative_tokens
    room = target.config.max_position_embeddings - len(prompt_ids)
    if room < 1:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in the model's context")
    params = dataclasses.replace(params, max_tokens=min(params.max_tokens, room))
    seq = Sequence(0, list(prompt_ids), params, status=SequenceStatus.RUNNING)
    total = len(prompt_ids) + params.max_tokens + k + 1
    cache = ContiguousKVCache.for_model(target.config, 1, total, target.dtype, target.device)
    if isinstance(proposer, DraftModelProposer):
        proposer.start(total)
    gen = make_generator(params.seed, target.device)
    stats = SpecStats()
    medusa = isinstance(proposer, MedusaGuesser)  # guesses from the hidden state of the last forward
    with contextlib.ExitStack() as stack:
        hidden = stack.enter_context(capture_hidden(target)) if medusa else None
        t0 = time.perf_counter()
        p = probs_from_logits(_forward(target, list(prompt_ids), cache, 0)[-1], params)
        if medusa:
            proposer.observe(hidden.pop()[0, -1])
        first = rejection_sample([[]], p[None], None, [gen])[0][0]
        stats.prefill_s = time.perf_counter() - t0
        seq.append_token(first, eos_token_ids, tokenizer)
        while not seq.is_finished:
            tokens = seq.prompt_token_ids + seq.output_token_ids
            # Never guess past the context or max_tokens: those guesses could not be kept.
            budget = seq.max_guesses(k)
            t1 = time.perf_counter()
            q = None
            if budget <= 0:
                guesses = []
            elif not isinstance(proposer, DraftModelProposer):  # n-gram, Medusa: guesses with no q
                guesses = proposer.propose(tokens)[:budget]
            else:
                guesses, q = proposer.propose(tokens, params, gen)
                guesses, q = guesses[:budget], q[:budget]
            t2 = time.perf_counter()
            logits = _forward(target, [tokens[-1]] + guesses, cache, len(tokens) - 1)
            if params.greedy:  # the argmax-match special case, without one-hot rows
                emitted = greedy_verify([guesses], logits.argmax(-1))[0]
            else:
                emitted = rejection_sample([guesses], probs_from_logits(logits, params), q, [gen])[0]
            stats.target_s += time.perf_counter() - t2
            stats.draft_s += t2 - t1
            stats.steps += 1
            stats.proposed += len(guesses)
            stats.accepted += len(emitted) - 1
            for tok in emitted:  # stop partway exactly where plain decoding would
                seq.append_token(tok, eos_token_ids, tokenizer)
                stats.emitted += 1
                if seq.is_finished:
                    break
            if isinstance(proposer, DraftModelProposer):
                proposer.rollback(seq.num_tokens - 1)
            elif medusa:  # the row that gave the last emitted token
                proposer.observe(hidden.pop()[0, len(emitted) - 1])
    return seq, stats
