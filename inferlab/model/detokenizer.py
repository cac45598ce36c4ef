"""Incremental detokenization: turn one new token into the text it adds, in O(1) per token.

Decoding the whole output again at every step (to stream it, or to look for a stop string) costs
O(n) per token, O(n^2) per request. Like vLLM's detokenizer, this keeps a read offset and decodes
only the new tail; byte-level BPE can split one UTF-8 character across tokens, so the incomplete
bytes are held back until the character is whole. ``tokenizers``' ``DecodeStream`` does exactly
that bookkeeping; this class adds the stop-string search, which only has to look at the new tail
(plus the last ``len(stop) - 1`` characters, where a stop string may have started).
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream


class Detokenizer:
    """Accumulates one sequence's output text. ``step(token)`` returns the text it adds ('' while
    a multi-byte character is incomplete); ``delta()`` returns what is safe to stream since the last
    call: with stop strings, the last ``len(stop) - 1`` characters wait, since they may be the start
    of a stop string that is never returned."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self.text = ""
        self.stop_index: int | None = None  # where the matched stop string starts in ``text``
        self._stream = DecodeStream(skip_special_tokens=True)
        self._reach = max((len(s) for s in self.stop), default=1) - 1
        self.finished = False
        self._sent = 0

    def step(self, token: int) -> str:
        piece = self._stream.step(self.tokenizer.hf, token) or ""
        if piece and self.stop:
            start = max(0, len(self.text) - self._reach)
            self.text += piece
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.stop_index = min(hits)
        else:
            self.text += piece
        return piece

    def finish(self, token_ids: list[int]) -> None:
        """At the end, bytes still held back (an incomplete character) are decoded as U+FFFD, as a
        full decode would."""
        self.finished = True
        if self.stop_index is None:
            full = self.tokenizer.decode(token_ids)
            if full.startswith(self.text):
                self.text = full

    @property
    def output_text(self) -> str:
        """The text so far, cut before the stop string that matched (which is never returned)."""
        return self.text if self.stop_index is None else self.text[: self.stop_index]

    def delta(self) -> str:
        text = self.output_text
        end = len(text) if self.finished else max(self._sent, len(text) - self._reach)
        out, self._sent = text[self._sent:end], end
        return out
