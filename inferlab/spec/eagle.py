"""EAGLE (Li et al., ICML 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty"): a draft that guesses in the target's feature space, not in token space.

A target's last decoder layer already holds, at position t, a feature f_t from which its head
reads p(x_{t+1}). Predicting the next *feature* is easier than predicting the next token from
scratch, so EAGLE's draft is one decoder layer over the target's own features:

    input at position t:  fc([embed(x_t), f_{t-1}])        (the token there, the feature before it)
    one decoder layer     (attention over the earlier positions' inputs: its own KV cache)
    output:               f^_t, a guess of f_t;  head(norm(f^_t)) gives the guess of x_{t+1}

The embedding is the target's (frozen, not stored here). Drafting goes on autoregressively in
feature space: the guessed token x^_{t+1} and the guessed feature f^_t make the next input, so k
guesses cost k passes of one layer. Where the target has computed a position, its true feature
replaces the guess (the engine recomputes the draft's K/V of kept guesses with them).

The head reads a *draft vocabulary*: the ``draft_vocab_size`` tokens the target emits most often
(EAGLE-3 and FR-Spec do this), so a guess costs a few thousand rows of the head instead of the
target's 49,152. ``d2t`` maps a draft id to the target's id; a token outside the draft vocabulary
is never guessed (its q is 0, and exact rejection sampling stays exact).

Training (``inferlab train eagle``, ``inferlab.spec.eagle_train``) runs the frozen target over its
own answers and fits f^_t to f_t (smooth L1) and the head to the target's next token (cross-entropy),
as EAGLE does. Chain drafts only: EAGLE's tree drafts (several guesses per position, verified with a
tree attention mask) would raise acceptance further, at the cost of a larger verify.
"""
from __future__ import annotations

import dataclasses
import json
import os
import weakref
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from inferlab.attention import AttentionMetadata, PagedAttentionMetadata, attention_mask
from inferlab.errors import InferlabError
from inferlab.folders import atomic_folder
from inferlab.model.config import ModelConfig
from inferlab.model.linear import Linear, default_linear
from inferlab.model import decode_layers
from inferlab.model.llama import STOCK, DecoderLayer, RMSNorm
from inferlab.model.rope import rope_cos_sin, rope_inv_freq
from inferlab.spec.medusa import beside_target, capture_output


class EagleDraft(nn.Module):
    """One decoder layer over [embed(x_t), f_{t-1}]; returns the guessed features f^_t (pre-norm)."""

    def __init__(self, target_config: ModelConfig, d2t: torch.Tensor):
        super().__init__()
        self.config = dataclasses.replace(target_config, num_hidden_layers=1, num_local_experts=0)
        h = self.config.hidden_size
        self.fc = Linear(2 * h, h, bias=True)  # on a CPU the f32 loop, as the target's linears: MKL's GEMV reads at half its speed
        self.layer = DecoderLayer(self.config, 0, default_linear)
        self.norm = RMSNorm(h, self.config.rms_norm_eps)
        self.lm_head = Linear(h, len(d2t), bias=False)
        self.register_buffer("d2t", d2t.long().clone())  # draft id -> target id
        inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope_theta, self.config.rope_scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.d2t.device

    @property
    def draft_vocab_size(self) -> int:
        return len(self.d2t)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor,
                metadata: AttentionMetadata | PagedAttentionMetadata | None = None) -> torch.Tensor:
        """embeds, features [B, T, H] (the token at t and the target's feature at t - 1) -> f^ [B, T, H]."""
        if metadata is None:
            b, t = embeds.shape[:2]
            metadata = AttentionMetadata(positions=torch.arange(t, device=embeds.device).expand(b, t))
        if isinstance(metadata, PagedAttentionMetadata):
            metadata.build_masks(self.config.sliding_window)
        elif metadata.attn_mask is None:
            metadata.attn_mask = attention_mask(embeds.shape[1], metadata.cache_start, metadata.key_mask,
                                                self.config.sliding_window, embeds.device)
        x = self.fc(torch.cat([embeds, features.to(embeds.dtype)], -1))
        cos, sin = rope_cos_sin(self.inv_freq, metadata.positions, x.dtype)
        if decode_layers.run(_as_stack(self), x, cos, sin, metadata, STOCK):  # drafting rows: the layer in one C call
            return x
        return self.layer(x, cos, sin, metadata)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Guessed features [..., H] -> logits over the draft vocabulary [..., draft_vocab_size]."""
        return self.lm_head(self.norm(features)).float()


class _Stack:
    """The draft's layer as ``inferlab.model.decode_layers`` reads a model: ``config`` and
    ``model.layers``. Kept beside the draft (``_STACKS``), not in it, so its modules are not counted twice."""

    def __init__(self, draft: EagleDraft):
        self.config = draft.config
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([draft.layer])


_STACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _as_stack(draft: EagleDraft) -> _Stack:
    stack = _STACKS.get(draft)
    if stack is None or stack.model.layers[0] is not draft.layer:
        _STACKS[draft] = stack = _Stack(draft)
    return stack


def last_layer_features(target):
    """Collect the output of the target's last decoder layer (the features f_t of every row of the
    forward, before the final norm): ``with last_layer_features(m) as seen``."""
    sinks = getattr(target, "last_layer_outputs", None)  # the model's own list: the C decode layers still run
    return sinks() if sinks is not None else capture_output(target.model.layers[-1])


def drafting_step(draft: EagleDraft, target, context: int = 128, batch: int = 1):
    """One drafting pass (``batch`` rows of the layer over a cached context of ``context`` positions,
    then the head), on the contiguous cache, as a function to time: ``bench.spec.costs`` times it in
    turn with the target's decode step for EAGLE's c."""
    from inferlab.cache import ContiguousKVCache

    h, dev, dt = target.config.hidden_size, target.device, target.dtype
    full = torch.arange(context, device=dev)[None].expand(batch, context)
    pos = torch.full((batch, 1), context, device=dev)
    with torch.inference_mode():
        dc = ContiguousKVCache.for_model(draft.config, batch, context + 1, dt, dev)
        zeros = torch.zeros(batch, context, h, dtype=dt, device=dev)
        draft(zeros, zeros, AttentionMetadata(positions=full, kv_cache=dc))
        e = target.model.embed_tokens(torch.ones(batch, 1, dtype=torch.long, device=dev))
        f = torch.zeros(batch, 1, h, dtype=dt, device=dev)

    @torch.inference_mode()
    def drafting():
        return draft.logits(draft(e, f, AttentionMetadata(positions=pos, kv_cache=dc, cache_start=context))).argmax(-1)

    return drafting


# ---------------------------------------------------------------- the folder that ships it

def eagle_folder_for(target: str | os.PathLike) -> Path:
    """Where the EAGLE draft of ``target`` lives (``beside_target``: ``smollm2_eagle``)."""
    return beside_target(target, "eagle")


def save_eagle(draft: EagleDraft, folder: str | os.PathLike, base_model: str, extra_files: dict | None = None,
               dtype: torch.dtype = torch.float16) -> Path:
    """config.json + model.safetensors (weights in ``dtype``; the target's embedding is not stored)."""
    with atomic_folder(folder) as tmp:
        tensors = {k: (v if k == "d2t" else v.to(dtype)).detach().contiguous().cpu()
                   for k, v in draft.state_dict().items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = {"architecture": "eagle", "base_model": base_model, "hidden_size": draft.config.hidden_size,
               "draft_vocab_size": draft.draft_vocab_size, "num_layers": 1, "embedding": "base_model (frozen, shared)",
               "target_vocab_size": draft.config.vocab_size}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return Path(folder)


def load_eagle(folder: str | os.PathLike, target_config: ModelConfig, device=None,
               dtype=torch.float32) -> EagleDraft:
    """The draft written by ``save_eagle``, for a target with ``target_config``; a missing folder
    or one made for another target is a one-line error that says what to do."""
    folder = Path(folder)
    if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
        raise InferlabError(f"no EAGLE draft at {folder}: train one on the target with `inferlab train eagle "
                            "--target NAME` (or give speculative_config 'model': a folder written by it)")
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("architecture") != "eagle":
        raise InferlabError(f"{folder} holds no EAGLE draft (its config.json says architecture "
                            f"{cfg.get('architecture')!r}): give the folder `inferlab train eagle` wrote")
    if (cfg.get("hidden_size"), cfg.get("target_vocab_size")) != (target_config.hidden_size, target_config.vocab_size):
        raise InferlabError(f"the EAGLE draft in {folder} was trained for a target of width {cfg.get('hidden_size')} "
                            f"and vocabulary {cfg.get('target_vocab_size')}, this target's are "
                            f"{target_config.hidden_size} and {target_config.vocab_size}: train one for it "
                            "with `inferlab train eagle`")
    state = load_file(str(folder / "model.safetensors"))
    draft = EagleDraft(target_config, state["d2t"])
    draft.load_state_dict({k: v.float() if k != "d2t" else v for k, v in state.items()})
    return draft.to(device=device, dtype=dtype).eval().requires_grad_(False)
