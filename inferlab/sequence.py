"""One request's state while it generates (vLLM's ``Sequence``): tokens so far and when to stop."""
from __future__ import annotations

import dataclasses
import enum

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
    stop_text: str | None = None  # the output text cut before a stop string, when one matched

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def output_text(self, tokenizer) -> str:
        """The generated text: cut before the stop string that matched, if one did."""
        if self.stop_text is not None:
            return self.stop_text
        return tokenizer.decode(self.output_token_ids) if tokenizer is not None else ""

    def append_token(self, token: int, eos_token_ids, tokenizer=None) -> None:
        """Add one generated token and decide whether the sequence is done."""
        self.output_token_ids.append(token)
        p = self.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids):
            return self._finish("stop")
        if p.stop and tokenizer is not None:
            text = tokenizer.decode(self.output_token_ids)
            hits = [i for i in (text.find(s) for s in p.stop) if i >= 0]
            if hits:
                self.stop_text = text[: min(hits)]  # the stop string itself is not returned
                return self._finish("stop")
        if len(self.output_token_ids) >= p.max_tokens:
            self._finish("length")

    def _finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
