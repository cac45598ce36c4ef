"""A draft model cut from the target itself: a few of its layers, its embedding, its head.

A draft model pays when it guesses what the target would say (acceptance a) at a small cost per
guess (c, the draft's forward over the target's). A separately trained small model has to learn
the language from nothing; on a CPU its cost is set by its depth (every layer is a fixed ~1 ms of
small ops) and by its embedding and head (smollm2's 49,152 x 576 table is 113 MB in fp32, more
than a fifth of the target). So the draft here is built from the target:

* its layers start as a few of the target's (the first ones, and the last one, which turns
  features into next-token predictions), then are tuned to imitate all 30 (``draft_train``);
* it *shares* the target's token embedding: the same tensor, not a copy, so the draft ships only
  its layers (a few MB) and costs nothing to look up;
* its head is the target's tied head restricted to a draft vocabulary, the few thousand tokens the
  target's answers use most (as EAGLE-3 and FR-Spec do): a guess reads 9 MB of head, not 113 MB.
  Logits off that vocabulary are -inf, so q is 0 there and rejection sampling stays exact: the
  target still emits any token, through the residual distribution (Leviathan et al. 2023).

Self-speculative decoding (Zhang et al. 2023, "Draft & Verify") and LayerSkip (Elhoushi et al.
2024) draft with a subset of the target's layers too; this draft keeps its own K/V (the engine's
``DraftProposer``), so it is an ordinary draft model that happens to start from the target.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from inferlab.errors import InferlabError
from inferlab.model.linear import linear
from inferlab.model.llama import CausalLM, on_meta
from inferlab.folders import atomic_folder
from inferlab.model.loader import ASSETS

ARCHITECTURE = "layer_draft"


class SubsetHead(nn.Module):
    """The target's head over ``guess_vocab`` only: ``forward`` returns logits over every token id
    (-inf off the vocabulary), ``sub_logits`` the [..., len(guess_vocab)] block training needs."""

    def __init__(self, embedding: torch.Tensor, guess_vocab: torch.Tensor):
        super().__init__()
        self.vocab_size = embedding.shape[0]
        self.register_buffer("guess_vocab", guess_vocab.long())
        self.register_buffer("rows", embedding.detach()[guess_vocab].clone(), persistent=False)
        self.quantized = None  # the rows in Q8_0, where ``quantize`` made them (inference only)

    def quantize(self) -> None:
        """Read the rows in Q8_0 from now on (a quarter of fp32's bytes), as a quantized target reads its head."""
        from inferlab.quant.ggml import GGMLLinear
        self.quantized = GGMLLinear.from_weight(self.rows.float(), "q8_0")

    def sub_logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None and not torch.is_grad_enabled():
            return self.quantized(x.float()).to(x.dtype)
        return linear(x, self.rows.to(x.dtype))  # on a CPU the f32 loop, as the target's head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_full((*x.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.guess_vocab, self.sub_logits(x))


def build(target: CausalLM, layers: list[int], guess_vocab: torch.Tensor) -> CausalLM:
    """A draft of ``len(layers)`` decoder layers whose weights start as the target's ``layers``
    (its final norm too), sharing the target's embedding, with a ``SubsetHead``."""
    cfg = dataclasses.replace(target.config, num_hidden_layers=len(layers), tie_word_embeddings=True)
    draft = CausalLM(cfg).to(dtype=target.dtype, device=target.device)
    for mine, theirs in zip(draft.model.layers, layers):
        mine.load_state_dict(target.model.layers[theirs].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    share_embedding(draft, target, guess_vocab)
    return draft


def share_embedding(draft: CausalLM, target: CausalLM, guess_vocab: torch.Tensor) -> None:
    """Point the draft's lookup table at the target's (one tensor, frozen) and its head at the
    target's rows of ``guess_vocab``."""
    draft.model.embed_tokens.weight = target.model.embed_tokens.weight
    draft.lm_head = SubsetHead(target.model.embed_tokens.weight, guess_vocab.to(target.device))


def trained_tensors(draft: CausalLM) -> dict[str, torch.Tensor]:
    """What the draft owns: its layers, its final norm and the draft vocabulary (not the embedding)."""
    state = {k: v for k, v in draft.state_dict().items()
             if k.startswith("model.layers.") or k.startswith("model.norm.")}
    state["guess_vocab"] = draft.lm_head.guess_vocab
    return state


def save(draft: CausalLM, folder: str | os.PathLike, base_model: str, source_layers: list[int],
         extra_files: dict[str, str] | None = None, dtype: torch.dtype = torch.float16) -> Path:
    """config.json (the target's, with the draft's depth and where its layers came from) +
    model.safetensors (layers and norm in ``dtype``, guess_vocab as int64) + ``extra_files``."""
    with atomic_folder(folder) as tmp:
        tensors = {k: (v if k == "guess_vocab" else v.to(dtype)).detach().contiguous().cpu()
                   for k, v in trained_tensors(draft).items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = {"architecture": ARCHITECTURE, "base_model": base_model, "source_layers": source_layers,
               "draft_vocab_size": int(draft.lm_head.guess_vocab.numel()),
               "embedding": "base_model (shared, frozen)", "torch_dtype": str(dtype).removeprefix("torch."),
               "model": draft.config.to_hf_dict()}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return Path(folder)


def folder_of(name: str | os.PathLike) -> Path | None:
    """The folder ``name`` means if it holds a layer draft (a folder, or a name under the package's
    models such as ``smollm2_draft``), else None (an ordinary draft model)."""
    for folder in (Path(name), ASSETS / str(name)):
        cfg = folder / "config.json"
        if cfg.exists() and json.loads(cfg.read_text()).get("architecture") == ARCHITECTURE:
            return folder
    return None


def load(folder: str | os.PathLike, target: CausalLM) -> CausalLM:
    """The draft written by ``save``, attached to ``target`` (its embedding and head rows); a draft
    made for another target is a one-line error that says what to do."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    mine = cfg["model"]
    want = (mine["hidden_size"], mine["vocab_size"], mine["num_key_value_heads"], mine["head_dim"])
    have = (target.config.hidden_size, target.config.vocab_size, target.config.num_key_value_heads,
            target.config.head_dim)
    if want != have:
        raise InferlabError(f"the draft in {folder} was cut from {cfg.get('base_model')!r} (width, vocabulary, KV "
                            f"heads, head size {want}); this target has {have}: train one for it with "
                            "`inferlab train draft --target NAME`")
    cfg_obj = dataclasses.replace(target.config, num_hidden_layers=mine["num_hidden_layers"], tie_word_embeddings=True)
    with on_meta():
        draft = CausalLM(cfg_obj)
    draft = draft.to_empty(device=target.device).to(target.dtype)
    state = load_file(str(folder / "model.safetensors"))
    guess_vocab = state.pop("guess_vocab")
    missing, unexpected = draft.load_state_dict({k: v.to(target.dtype) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not k.startswith(("model.embed_tokens", "lm_head"))]
    if missing or unexpected:
        raise InferlabError(f"{folder}/model.safetensors does not fit its config (missing {missing[:3]}, unexpected "
                            f"{unexpected[:3]}): retrain it with `inferlab train draft`")
    from inferlab.model.rope import rope_inv_freq
    draft.inv_freq = rope_inv_freq(cfg_obj.head_dim, cfg_obj.rope_theta, cfg_obj.rope_scaling).to(target.device)
    share_embedding(draft, target, guess_vocab)
    return draft.eval().requires_grad_(False)


def attach(name: str | os.PathLike, target: CausalLM) -> CausalLM | None:
    """The layer draft ``name`` means, loaded onto ``target`` as the engine runs it (its linears in
    Q8_0 under a quantized target, as an EAGLE draft's are; q/k/v and gate/up packed, as ``LLM``
    packs the target); None if ``name`` is no layer draft."""
    from inferlab.model.packing import pack_projections
    from inferlab.quant.quantize import is_quantized, quantize_like_target

    folder = folder_of(name)
    if folder is None:
        return None
    draft = quantize_like_target(load(folder, target), target)
    if is_quantized(target):  # the head's rows too
        draft.lm_head.quantize()
    pack_projections(draft)
    return draft
