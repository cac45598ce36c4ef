"""Calibration data and activation capture for GPTQ and AWQ.

Both methods look at what each linear layer actually receives: a few dozen windows of the corpus'
*train* split (never the test split the perplexity is measured on) are run through the model, and
forward hooks record each linear's inputs. Layers are processed in order, each on the previous layer's
outputs (``LayerInputs``), so earlier (already quantized) layers shape the inputs later layers are
fitted to.
"""
from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from inferlab import corpus, loop_settings


def calibration_tokens(tokenizer, n_samples: int = 64, seq_len: int = 512, seed: int = 0,
                       split: str = "train") -> torch.Tensor:
    """``n_samples`` random windows of ``seq_len`` tokens from ``split`` -> LongTensor [n_samples, seq_len]."""
    files = corpus.load_corpus(split)
    rng = random.Random(seed)
    rng.shuffle(files)
    eot = tokenizer.hf.token_to_id("<|endoftext|>")
    need, ids = 2 * n_samples * seq_len, []
    for f in files:  # tokenize only as many files as the windows need
        ids += ([eot] if eot is not None else []) + tokenizer.encode(f.text, add_special_tokens=False)
        if len(ids) >= need:
            break
    if len(ids) <= seq_len:
        raise ValueError(f"the {split} split has only {len(ids)} tokens: use a shorter --seq-len")
    stream = np.asarray(ids, dtype=np.int64)
    starts = [rng.randrange(0, len(stream) - seq_len) for _ in range(n_samples)]
    return torch.from_numpy(np.stack([stream[s:s + seq_len] for s in starts]))


class _StopForward(Exception):
    pass


@torch.no_grad()
def run_through_layer(model, tokens: torch.Tensor, layer_idx: int, batch_size: int = 8) -> None:
    """Run calibration ``tokens`` through the model, stopping after decoder layer ``layer_idx``
    (the hooks registered on that layer's linears see every batch): a one-off look at one layer's
    inputs. The quantizers, which visit every layer, carry the inputs instead (``LayerInputs``)."""
    layer = model.model.layers[layer_idx]

    def stop(module, args, output):
        raise _StopForward

    handle = layer.register_forward_hook(stop)
    try:
        _run_batches(model, tokens, batch_size)
    finally:
        handle.remove()


def _run_batches(model, tokens: torch.Tensor, batch_size: int) -> None:
    """The model on ``tokens``, ``batch_size`` rows at a time; a hook that raises ``_StopForward``
    ends each batch's forward where it has seen what it needs."""
    for i in range(0, len(tokens), batch_size):
        try:
            model(tokens[i:i + batch_size].to(model.device))
        except _StopForward:
            pass


class LayerInputs:
    """The calibration batches' hidden states at the input of one decoder layer, carried forward.

    The model runs once, up to the first decoder layer; after that each layer runs on what the
    previous one returned, as the reference implementations of GPTQ and AWQ do. Calibrating L
    layers then costs 2L layer forwards (one to capture, one to advance with the changed layer),
    where re-running the model up to each layer cost L(L+1)/2 layer forwards."""

    def __init__(self, model, tokens: torch.Tensor, batch_size: int = 8):
        self.model, self.layer, self.batches = model, 0, []

        def grab(module, args):
            self.batches.append(list(args))  # (hidden states, cos, sin, attention metadata)
            raise _StopForward

        handle = model.model.layers[0].register_forward_pre_hook(grab)
        try:
            with torch.no_grad():
                _run_batches(model, tokens, batch_size)
        finally:
            handle.remove()

    @torch.no_grad()
    def run(self, keep: bool = False) -> None:
        """Run the current layer on every batch (hooks on its linears see each one); with ``keep``,
        its outputs become the next layer's inputs. Call ``run()`` to capture, change the layer,
        then ``run(keep=True)``, so later layers are fitted to what the changed layer produces."""
        layer = self.model.model.layers[self.layer]
        with loop_settings.held():
            for args in self.batches:
                out = layer(*args)
                if keep:
                    args[0] = out
        if keep:
            self.layer += 1


def capture_inputs(modules: dict[str, nn.Module], on_input) -> list:
    """Call ``on_input(name, x2d)`` with each module's input flattened to [tokens, in_features]."""
    def hook(name):
        def fn(module, args):
            on_input(name, args[0].detach().reshape(-1, args[0].shape[-1]).float())
        return fn
    return [m.register_forward_pre_hook(hook(n)) for n, m in modules.items()]


def layer_linears(layer: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers of one decoder layer, by their name inside it (self_attn.q_proj, ...)."""
    return {n: m for n, m in layer.named_modules() if isinstance(m, nn.Linear)}
