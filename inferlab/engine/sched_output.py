"""What one scheduler step decided (vLLM v1's ``SchedulerOutput``): the sequences to run and how many
tokens each (a decode's speculative guesses included, as lookahead behind its last token), the
copy-on-write block copies to make first, and who was preempted.

Its own module so that the policies (``policy.py``) and the scheduler's primitives
(``scheduler.py``) both use it without importing each other.
"""
from __future__ import annotations

import dataclasses

from inferlab.engine.request import EngineSequence


@dataclasses.dataclass
class ScheduledSeq:
    seq: EngineSequence
    num_new_tokens: int
    spec_token_ids: list[int] = dataclasses.field(default_factory=list)  # the last len() of the new tokens

    @property
    def num_committed(self) -> int:
        """New tokens that are the sequence's own (the rest are guesses to verify)."""
        return self.num_new_tokens - len(self.spec_token_ids)

    @property
    def is_decode(self) -> bool:
        """This step computes only the token sampled last (not a prompt token, however short the
        prompt), plus any guesses behind it."""
        return self.num_committed == 1 and self.seq.is_decoding


@dataclasses.dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = dataclasses.field(default_factory=list)
    copies: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # copy-on-write (src, dst)
    preempted: list[EngineSequence] = dataclasses.field(default_factory=list)

    def add(self, seq: EngineSequence, num_new_tokens: int) -> None:
        spec = seq.num_computed_tokens + num_new_tokens - seq.num_tokens  # positions past its last token
        self.scheduled.append(ScheduledSeq(seq, num_new_tokens, list(seq.spec_token_ids[:max(spec, 0)])))

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)
