"""Sentence embedders for the semantic cache: text in, one unit vector per text out.

``WordLlamaEmbedder`` is a real sentence-embedding model that works offline: wordllama (MIT,
Miller 2024) ships 16 MB of token embeddings distilled from an LLM's embedding table inside its
wheel; a sentence is the (weighted) average of its token vectors, 256 dimensions, well under a
millisecond per sentence on a CPU. ``HiddenStateEmbedder`` uses the engine's own model: the mean
of its last hidden states over the prompt's tokens. A language model trained on Python source was
never asked to put paraphrases close together, so the comparison shows why serving systems use a
dedicated embedding model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from inferlab.errors import InferlabError


def normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float32), so a dot product is a cosine similarity."""
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


class WordLlamaEmbedder:
    """wordllama's 256-dimensional model, loaded from the weights inside its own package."""

    name = "wordllama"

    def __init__(self, dim: int = 256):
        try:
            import wordllama
        except ImportError:
            raise InferlabError("the semantic cache's embedder needs wordllama: pip install -e '.[strategy]'") from None
        # load(disable_download=True) alone looks for the tokenizer in a folder that does not exist;
        # the package's own folder holds both the weights and the tokenizer.
        self.model = wordllama.WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True,
                                              dim=dim)
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        if isinstance(texts, str):
            texts = [texts]
        return normalize(self.model.embed(list(texts)))


class HiddenStateEmbedder:
    """Mean-pooled final hidden states (after the last norm) of a ``CausalLM`` over each text."""

    name = "hidden states"

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.dim = model.config.hidden_size

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> np.ndarray:
        if isinstance(texts, str):
            texts = [texts]
        captured = []
        hook = self.model.model.norm.register_forward_hook(lambda m, i, out: captured.append(out))
        try:
            rows = []
            for text in texts:
                ids = self.tokenizer.encode(text)
                captured.clear()
                self.model(torch.tensor([ids], device=self.model.device))
                rows.append(captured[0][0].float().mean(0).cpu().numpy())
        finally:
            hook.remove()
        return normalize(np.stack(rows))
