"""A thin wrapper over HF ``tokenizers`` (tokenizer.json): encode, decode, special ids."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    def __init__(self, hf: _HFTokenizer, eos_token_ids: tuple[int, ...] = (), bos_token_id: int | None = None):
        self.hf = hf
        self.eos_token_ids = tuple(eos_token_ids)
        self.bos_token_id = bos_token_id

    @classmethod
    def from_file(cls, path: str | Path, eos_token_ids=(), bos_token_id=None) -> "Tokenizer":
        return cls(_HFTokenizer.from_file(str(path)), eos_token_ids, bos_token_id)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save(self, path: str | Path) -> None:
        self.hf.save(str(path))
