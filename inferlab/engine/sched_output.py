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
    num_spec_tokens: int = 0  # how many of the new tokens, the last ones, are guesses to verify

    @property
    def spec_token_ids(self) -> list[int]:
        """The guesses this step verifies. They are kept in one place, on the sequence
        (``SchedulerOutput.add`` trims them to the ones scheduled), until the step's results
        clear them; a draft model writes its guesses there after scheduling."""
        return self.seq.spec_token_ids

    @property
    def num_committed(self) -> int:
        """New tokens that are the sequence's own (the rest are guesses to verify)."""
        return self.num_new_tokens - self.num_spec_tokens

    def keep_guesses(self, n: int) -> None:
        """Verify only the first ``n`` guesses: a proposer that stops drafting partway (its
        confidence fell, ``inferlab.engine.proposer.Proposer.confidence_threshold``) drops the
        rest after scheduling. Their reserved KV slots stay the sequence's, as a rejected guess's do."""
        drop = self.num_spec_tokens - n
        if drop > 0:
            del self.seq.spec_token_ids[n:]
            self.num_new_tokens -= drop
            self.num_spec_tokens = n

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
        """Schedule ``num_new_tokens`` of ``seq``; the positions past its last token are its first
        guesses, and the guesses the budget left out are dropped."""
        spec = max(seq.num_computed_tokens + num_new_tokens - seq.num_tokens, 0)  # positions past its last token
        del seq.spec_token_ids[spec:]
        self.scheduled.append(ScheduledSeq(seq, num_new_tokens, spec))

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)
