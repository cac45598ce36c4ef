"""What every notebook calls first: a seed, a progress bar, and a model to measure."""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

EMBEDDED_TARGET = Path(__file__).resolve().parents[1] / "assets" / "models" / "target"


def seed_everything(seed: int = 0) -> int:
    """Seed Python, NumPy and torch (CPU and CUDA) so a notebook re-runs to the same numbers.

    Timings still vary from run to run; everything computed from random numbers does not.
    """
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses; this process already hashed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    return seed


def progress(iterable=None, desc: str | None = None, **kwargs):
    """``tqdm.auto`` progress: a widget bar in JupyterLab, a text bar in a terminal.

    Set ``TQDM_DISABLE=1`` (the tests do) to silence every bar without touching the notebook.
    """
    if "disable" not in kwargs:  # tqdm's notebook bar does not read TQDM_DISABLE itself
        kwargs["disable"] = os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")
    return tqdm(iterable, desc=desc, **kwargs)


def demo_model(name: str = "target") -> str:
    """The model the notebooks measure: the embedded ``target`` once it is built.

    Before ``inferlab train`` has produced it, a tiny randomly initialised Llama (same
    architecture, a byte-level BPE trained on a few standard-library files) is written to a cache
    folder and its path returned, so every notebook still runs end to end. Its text is gibberish;
    its timings teach the same lesson.
    """
    embedded = EMBEDDED_TARGET.parent / name
    if (embedded / "config.json").exists():
        return name
    return str(tiny_random_model())


def tiny_random_model(folder: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """Write (once) a random Llama with the embedded target's shape (6 layers, width 256, GQA 8:2)
    but a 512-entry vocabulary, in HF format, and return its folder (~4.6M parameters)."""
    from inferlab.model.config import ModelConfig
    from inferlab.model.loader import save_checkpoint
    from inferlab.model import CausalLM

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferlab"
    folder = Path(folder) if folder is not None else cache / "random-llama-w256-l6"
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    tok = _train_tiny_tokenizer(vocab_size=512)
    hf_tok, eos = tok.hf, tok.eos_token_ids[0]
    cfg = ModelConfig(vocab_size=hf_tok.get_vocab_size(), hidden_size=256, intermediate_size=768,
                      num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=1024, tie_word_embeddings=True, eos_token_ids=(eos,))
    gen = torch.Generator().manual_seed(seed)
    model = CausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return save_checkpoint(model, tok, folder)


def _train_tiny_tokenizer(vocab_size: int):
    """A byte-level BPE trained in well under a second on a few standard-library modules."""
    import inspect
    import json as json_mod
    import textwrap as textwrap_mod

    from inferlab.model.tokenizer import train_bpe

    return train_bpe([inspect.getsource(m) for m in (json_mod, textwrap_mod, random)], vocab_size, min_frequency=0)
