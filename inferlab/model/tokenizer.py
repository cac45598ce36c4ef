"""A thin wrapper over HF ``tokenizers`` (tokenizer.json): encode, decode, special ids, and the
model's chat template (``chat_template``, see ``inferlab.model.chat``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer as _HFTokenizer

if TYPE_CHECKING:
    from inferlab.model.chat import ChatTemplate

EOT = "<|endoftext|>"  # the end-of-text token: separates documents, ends a generation


class Tokenizer:
    """``chat_template``: how the model lays out a conversation (a ``ChatTemplate``), or None for
    a model trained on plain text; the loader sets it from the model's files."""

    def __init__(self, hf: _HFTokenizer, eos_token_ids: tuple[int, ...] = (), bos_token_id: int | None = None,
                 chat_template: ChatTemplate | None = None):
        self.hf = hf
        self.eos_token_ids = tuple(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template

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

    def save_folder(self, folder: str | Path) -> None:
        """``tokenizer.json`` into ``folder``, and a real chat template where transformers 5 writes
        it (``chat_template.jinja``, its special tokens in ``tokenizer_config.json``), so the folder
        loads back with the same chat format."""
        folder = Path(folder)
        self.save(folder / "tokenizer.json")
        if self.chat_template is not None and not self.chat_template.is_default:
            (folder / "chat_template.jinja").write_text(self.chat_template.source, encoding="utf-8")
            (folder / "tokenizer_config.json").write_text(json.dumps(self.chat_template.special_tokens, indent=2) + "\n")


def train_bpe(texts, vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE (GPT-2 style) trained on ``texts``: every byte is a token, so any text
    encodes; merges of frequent pairs are learnt up to ``vocab_size`` entries. ``<|endoftext|>``
    is the end-of-text and beginning-of-text id."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = _HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(texts, trainer)
    eot = hf.token_to_id(EOT)
    return Tokenizer(hf, (eot,), eot)
