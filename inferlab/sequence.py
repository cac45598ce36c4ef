"""One request's state while it generates (vLLM's ``Sequence``): tokens so far and when to stop."""
from __future__ import annotations

import dataclasses
import enum

from inferlab.model.detokenizer import Detokenizer
from inferlab.sampling import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass
class Sequence:
    seq_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None  # "stop" (eos, stop id or stop string) or "length"
    detokenizer: Detokenizer | None = dataclasses.field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def max_guesses(self, k: int) -> int:
        """How many of ``k`` speculative guesses could be kept: a verify step emits the accepted
        guesses plus one token of its own, and never more than ``max_tokens`` allows (0 or less:
        guess nothing)."""
        return min(k, self.params.max_tokens - len(self.output_token_ids) - 1)

    def output_text(self, tokenizer=None) -> str:
        """The generated text: cut before the stop string that matched, if one did."""
        if self.detokenizer is not None:
            return self.detokenizer.output_text
        return tokenizer.decode(self.output_token_ids) if tokenizer is not None else ""

    def append_token(self, token: int, eos_token_ids, tokenizer=None) -> None:
        """Add one generated token, detokenize it incrementally, decide whether the sequence is done."""
        self.output_token_ids.append(token)
        p = self.params
        detok = self.detokenizer
        if tokenizer is not None and detok is None:
            detok = self.detokenizer = Detokenizer(tokenizer, p.stop)
        if detok is not None:
            detok.step(token)
        if detok is not None and detok.stop_index is not None:
            self._finish("stop")
        elif token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids):
            self._finish("stop")
        elif len(self.output_token_ids) >= p.max_tokens:
            self._finish("length")

    def take_delta(self) -> str:
        """The text that is safe to stream and was not handed out yet (see ``Detokenizer.delta``)."""
        return self.detokenizer.delta() if self.detokenizer is not None else ""

    def _finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        if self.detokenizer is not None:
            self.detokenizer.finish(self.output_token_ids)
