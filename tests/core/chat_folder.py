"""A toy chat model: the embedded target with ChatML's two special tokens and a chat template, as an
HF folder that transformers loads too.

``<|im_start|>`` and ``<|im_end|>`` get ids 4096 and 4097 (two new embedding rows; the output
head is untied so its rows are free). The head's ``<|im_end|>`` row is twice the row of a token
the target writes early in its reply (``make_chat_model``), so greedy decoding emits ``<|im_end|>``
after a few tokens, as a model trained on ChatML ends its turn.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Tokenizer

from inferlab.model.loader import ASSETS

IM_START, IM_END = 4096, 4097
CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FILES = ("chat_template.jinja", "tokenizer_config.json", "chat_template.json")


def make_chat_folder(folder: Path, template: str = CHATML, where: str = "chat_template.jinja",
                     ends_turn: int | None = None) -> Path:
    """The toy chat model in ``folder``, its template stored in ``where`` (one of FILES).
    ``ends_turn``: the token whose head row ``<|im_end|>`` doubles (None: the head never picks it)."""
    shutil.copytree(ASSETS / "target", folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    tok.save(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "vocab_size": IM_END + 1, "tie_word_embeddings": False}))
    weights = load_file(str(folder / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"]
    head = torch.cat([embed, torch.zeros(2, embed.shape[1], dtype=embed.dtype)])
    if ends_turn is not None:
        head[IM_END] = 2 * embed[ends_turn]
    weights["model.embed_tokens.weight"] = torch.cat([embed, embed[:1], embed[:1]])
    weights["lm_head.weight"] = head
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if where == "tokenizer_config.json":
        cfg = json.loads((folder / where).read_text())
        (folder / where).write_text(json.dumps({**cfg, "chat_template": template}))
    elif where == "chat_template.json":
        (folder / where).write_text(json.dumps({"chat_template": template}))
    else:
        (folder / where).write_text(template)
    return folder


def make_chat_model(root: Path, conversation: list[dict], where: str = "chat_template.jinja") -> Path:
    """The toy chat model whose greedy reply to ``conversation`` ends its turn after a few tokens:
    ``<|im_end|>`` doubles the head row of the first new token at position 4 or later of the reply
    without it, so it wins there at the latest."""
    from inferlab import LLM, SamplingParams

    probe = LLM(str(make_chat_folder(root / "probe", where=where)), device="cpu")
    reply = probe.chat(conversation, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0].token_ids
    k = next(i for i in range(4, len(reply)) if reply[i] not in reply[:i])
    return make_chat_folder(root / "chat", where=where, ends_turn=reply[k])
