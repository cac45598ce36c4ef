"""What the engine keeps per request and per sequence (vLLM's Request / SequenceGroup).

A request is one ``add_request`` call: a prompt and its ``SamplingParams``. With ``n > 1`` it
owns ``n`` sequences that share the prompt's KV blocks: the first one prefills the prompt, the
others are forked from it (copy-on-write) once the prompt's logits exist.

The engine's state of a sequence is one number beyond its tokens: ``num_computed_tokens``, how
many of its tokens already have K/V in the cache. Each step computes some of the rest: all of a
prompt, a chunk of it, or the one token sampled last (decode). When the step reaches the last
token, its logits give the next token. A preempted sequence drops its blocks and goes back to 0:
its prompt *and* its output so far are recomputed as if they were one prompt (vLLM's recompute).

With speculative decoding a decoding sequence also carries ``spec_token_ids``: a proposer's
guesses for the tokens after its last one. They are not its tokens yet: the step computes them as
lookahead behind the last token, the verifier keeps a prefix of them, and the rest are forgotten
(``num_computed_tokens`` moves back over their slots).

Log-probs (``inferlab.logprobs``) live beside the tokens: ``logprobs`` one entry per output token,
appended with it, so a preempted sequence keeps them and its recompute adds none; the request's
``prompt_logprobs`` grow chunk by chunk as its prefill computes the prompt's rows.

Every sequence carries its request's ``priority`` and shares its request's ``metrics`` (one
object, holding the ``arrival_time``): under the ``"priority"`` scheduling policy the queues are
ordered by them (``scheduler.py``). Each is kept once: the request has no priority of its own,
and no sequence a copy of the arrival time.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from inferlab.sampling import SamplingParams
from inferlab.sequence import Sequence


@dataclasses.dataclass(eq=False)
class EngineSequence(Sequence):
    request_id: str = ""
    index: int = 0                   # which of the request's n completions
    num_computed_tokens: int = 0     # tokens whose K/V are in the cache
    num_pending_forks: int = 0       # children still to fork from this sequence after its prefill
    generator: torch.Generator | None = None
    sent_tokens: int = 0
    spec_token_ids: list[int] = dataclasses.field(default_factory=list)  # guesses to verify this step
    priority: int = 0                # vLLM's request priority: lower is served first (scheduling_policy="priority")
    metrics: RequestMetrics | None = None   # its request's, shared: arrival_time breaks ties between priorities
    logprobs: list[dict] | None = None      # one {token_id: Logprob} per output token (params.logprobs set)
    cumulative_logprob: float = 0.0
    prompt_logprobs: list | None = None     # the request's PromptLogprobs, shared by its n sequences
    __eq__ = object.__eq__           # identity, not field equality: the queues hold objects
    __hash__ = object.__hash__

    @property
    def arrival_time(self) -> float:
        """Its request's arrival (``time.monotonic()``); 0 for a sequence made without a request."""
        return 0.0 if self.metrics is None else self.metrics.arrival_time

    @property
    def needs_prompt_logits(self) -> bool:
        """Its request wants prompt log-probs not all computed yet: the prompt's rows must run
        through the lm_head, so no prefix-cache hit may skip them (vLLM does the same)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def is_decoding(self) -> bool:
        """All its tokens but the one sampled last are computed: the next step is a decode."""
        return bool(self.output_token_ids) and self.num_computed_tokens == self.num_tokens - 1

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, then the guesses ``spec_token_ids`` past the
        end (positions a step computes as lookahead), without concatenating the lists."""
        n = self.num_tokens
        if end > n:
            return self.token_ids(min(start, n), n) + self.spec_token_ids[max(start - n, 0):end - n]
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]


@dataclasses.dataclass
class RequestMetrics:
    """Times (``time.monotonic()``) for TTFT and TPOT (vLLM's RequestMetrics)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclasses.dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[EngineSequence]
    metrics: RequestMetrics = dataclasses.field(default_factory=lambda: RequestMetrics(time.monotonic()))
    aborted: bool = False
    stream: bool = True  # False: only the final output is reported
    prompt_logprobs: list | None = None  # PromptLogprobs when params.prompt_logprobs is set

    @property
    def finished(self) -> bool:
        return self.aborted or (len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs))
