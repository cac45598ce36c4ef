"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads"): k small heads that read the target's own last hidden state.

A decoder's last hidden state h_t (after the final norm) already carries more than the next
token: the lm_head turns it into p(x_{t+1}). Medusa adds k heads on the same h_t, head i guessing
x_{t+1+i}, the token *after* the next (i = 1), the one after that (i = 2)... Each head is one
residual block and the target's own (frozen) lm_head:

    logits_i = lm_head(h + SiLU(W_i h + b_i))

With W_i = 0 a head starts as a copy of the target's next-token prediction, a sensible start
(Medusa's own initialisation). Medusa-1 trains only the heads on a frozen backbone, so the target's
outputs do not change at all; ``inferlab train medusa`` (``inferlab.spec.medusa_train``) does that.

In the engine (``inferlab.engine.medusa``) the heads cost no second target forward: the verify
forward that scores a step's guesses also yields the hidden state of the last kept position, and
the heads turn it into the next step's guesses (argmax: no distribution, so the verifier uses the
deterministic-draft rule). One head can only guess one position, so k <= the number of heads.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from inferlab.errors import InferlabError
from inferlab.folders import atomic_folder
from inferlab.model.linear import Linear, linear
from inferlab.model.loader import ASSETS


class ResBlock(nn.Module):
    """h + SiLU(W h + b), W and b zero at the start (the block is then the identity)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = Linear(hidden_size, hidden_size)  # on a CPU the f32 loop, as the target's linears
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + F.silu(self.linear(h))


class MedusaHeads(nn.Module):
    """``num_heads`` residual blocks over the target's final-norm hidden state; the logits come
    from the lm_head passed in (the target's own: the heads store only their blocks)."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.blocks = nn.ModuleList(ResBlock(hidden_size) for _ in range(num_heads))
        # optional: the token ids a guess may take (FR-Spec's idea, as EAGLE's draft vocabulary): with a
        # 49,152-token head, each head's full logits read 113 MB; the rows of the few thousand tokens an
        # answer mostly uses read a tenth of that. Guesses are checked by argmax match, so outputs stay exact.
        self.register_buffer("guess_vocab", None)
        self._rows = None  # (lm_head weight's data_ptr, its rows of guess_vocab)

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module, num_heads: int | None = None) -> torch.Tensor:
        """hidden [..., H] -> logits [n, ..., V] of heads 1..n (n = ``num_heads`` or all)."""
        blocks = self.blocks[:num_heads or self.num_heads]
        return torch.stack([lm_head(block(hidden)) for block in blocks]).float()

    @torch.inference_mode()
    def propose(self, hidden: torch.Tensor, lm_head: nn.Module, k: int, with_probs: bool = False):
        """[B, H] hidden states -> [B, k] guesses: each head's argmax (Medusa's greedy chain), over
        ``guess_vocab`` where the heads have one. ``with_probs``: also each guess's probability
        under its head's softmax [B, k] (what a confidence threshold stops the chain on)."""
        if self.guess_vocab is None:
            logits = self(hidden, lm_head, k)  # [k, B, V]
            best = logits.argmax(-1).T
            return (best, logits.softmax(-1).amax(-1).T) if with_probs else best
        weight = lm_head.weight if isinstance(getattr(lm_head, "weight", None), torch.Tensor) else None
        key = weight.data_ptr() if weight is not None else id(lm_head)
        if self._rows is None or self._rows[0] != key:  # gathered once per head weight
            full = weight if weight is not None else lm_head.dequantize()  # a quantized head (a GGUF's Q8_0)
            rows = full[self.guess_vocab].to(hidden.dtype).contiguous()
            if weight is None:  # the target reads its head in Q8_0: so do these rows (a quarter of fp32's bytes)
                from inferlab.quant.ggml import GGMLLinear
                rows = GGMLLinear.from_weight(rows, "q8_0")
            self._rows = (key, rows)
        n, rows = hidden.shape[0], self._rows[1]
        # every head's block first, then one product over the rows for all k of them: the rows are read once
        h = torch.cat([block(hidden) for block in self.blocks[:k]])  # [k n, H]
        logits = linear(h, rows) if isinstance(rows, torch.Tensor) else rows(h)  # float rows: the f32 loop on a CPU
        best = logits.argmax(-1).view(k, n).T  # [n, k]
        guesses = self.guess_vocab[best]
        return (guesses, logits.float().softmax(-1).amax(-1).view(k, n).T) if with_probs else guesses


# ---------------------------------------------------------------- the folder beside the target

def beside_target(target: str | os.PathLike, suffix: str) -> Path:
    """Where a proposer trained on ``target`` lives: ``inferlab/assets/models/<name>_<suffix>`` for
    an embedded or real model's name (``target_medusa``, ``smollm2_eagle``), else
    ``<target folder>_<suffix>`` beside the folder."""
    text = str(target)
    if "/" not in text and os.sep not in text and not Path(text).is_dir():
        return ASSETS / f"{text}_{suffix}"
    folder = Path(text)
    return folder.parent / f"{folder.name}_{suffix}"


def heads_folder_for(target: str | os.PathLike) -> Path:
    """Where the Medusa heads of ``target`` live (``beside_target``: ``target_medusa``)."""
    return beside_target(target, "medusa")


def save_heads(heads: MedusaHeads, folder: str | os.PathLike, base_model: str, extra_files: dict | None = None) -> Path:
    """Write config.json + model.safetensors (+ card) atomically."""
    with atomic_folder(folder) as tmp:
        tensors = {f"medusa_head.{i}.linear.{n}": p.detach().float().contiguous().cpu()
                   for i, block in enumerate(heads.blocks) for n, p in block.linear.named_parameters()}
        if heads.guess_vocab is not None:
            tensors["guess_vocab"] = heads.guess_vocab.cpu().contiguous()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = {"architecture": "medusa", "medusa_num_heads": heads.num_heads, "medusa_num_layers": 1,
               "hidden_size": heads.hidden_size, "base_model": base_model, "lm_head": "base_model (frozen, shared)",
               "guess_vocab_size": None if heads.guess_vocab is None else len(heads.guess_vocab)}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return Path(folder)


def load_heads(folder: str | os.PathLike, hidden_size: int, device=None, dtype=torch.float32) -> MedusaHeads:
    """Heads from a folder written by ``save_heads``; a missing folder or a width that is not the
    target's is a one-line error saying what to do."""
    folder = Path(folder)
    if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
        raise InferlabError(f"no Medusa heads at {folder}: train them on the target with `inferlab train medusa` "
                            "(or give speculative_config 'model': a folder of heads)")
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("hidden_size") != hidden_size:
        raise InferlabError(f"the Medusa heads in {folder} read hidden states of width {cfg.get('hidden_size')}, "
                            f"the target's are {hidden_size}: train heads for this target with `inferlab train medusa`")
    heads = MedusaHeads(hidden_size, int(cfg["medusa_num_heads"]))
    stored = load_file(str(folder / "model.safetensors"))
    if "guess_vocab" in stored:
        heads.guess_vocab = stored.pop("guess_vocab").long()
    heads.blocks.load_state_dict({k.removeprefix("medusa_head."): v for k, v in stored.items()})
    return heads.to(device=device, dtype=dtype).eval().requires_grad_(False)


@contextlib.contextmanager
def capture_output(module):
    """Collect ``module``'s outputs during the forwards run inside the block (a forward hook)."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        yield seen
    finally:
        handle.remove()


def capture_hidden(model):
    """Collect the target's final-norm hidden states during its forwards: the norm runs only on the
    rows whose logits are computed (``logits_indices``), so these are exactly those rows' h."""
    return capture_output(model.model.norm)


class MedusaGuesser:
    """Medusa on the contiguous reference loop (``inferlab.spec.reference``): the loop hands it the
    hidden state of the row that gave the last emitted token (``observe``), and the next step's
    ``propose`` returns the heads' guesses made from it."""

    def __init__(self, target, heads: MedusaHeads, num_speculative_tokens: int):
        if not 1 <= num_speculative_tokens <= heads.num_heads:
            raise ValueError(f"num_speculative_tokens must be in 1..{heads.num_heads} (one per head), "
                             f"got {num_speculative_tokens}")
        self.target, self.heads, self.num_speculative_tokens = target, heads, num_speculative_tokens
        self.guesses: list[int] = []

    def observe(self, hidden_row: torch.Tensor) -> None:
        self.guesses = self.heads.propose(hidden_row[None], self.target.lm_head, self.num_speculative_tokens)[0].tolist()

    def propose(self, token_ids) -> list[int]:
        return list(self.guesses)
