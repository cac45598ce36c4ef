"""Named random-weight models: realistic shapes for timing, no training, no download.

The embedded target (5.6M params, 22 MB in fp32) fits in a CPU's caches, so its decode measures
per-op overhead, not memory bandwidth. ``random-80m`` has the shape of a small real Llama (hidden
768, 12 layers, 12 query heads and 4 KV heads of 64, MLP 2048, the target's 4096-token tokenizer,
tied embeddings: 78.7M params, 315 MB in fp32), so reading its weights dominates a decode step,
as in a 7B model. Its weights are random (normal, std 0.02, fixed seed): **its text is noise and
its perplexity means nothing ("n/a")**; it exists to be timed. Quality is measured on the trained pair.

Built on first use into ``~/.cache/inferlab/<name>`` (``INFERLAB_CACHE`` moves it), never committed;
``LLM(model="random-80m")``, ``inferlab bench decode --model random-80m`` load it by name.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from inferlab.folders import cache_dir

SHAPES = {
    "random-80m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=4, head_dim=64, max_position_embeddings=2048),
}
SEED = 0
NOTE = ("Random weights (normal, std 0.02, seed {seed}) in the shape of a small Llama, with the embedded target's "
        "tokenizer. Its text is noise and its perplexity is meaningless: it exists to time decoding on a model "
        "too large for the CPU's caches. Built by inferlab.model.random_model; do not commit it.\n")


def is_random_model(name_or_path: str | os.PathLike) -> bool:
    """True for a random model's name or folder: its perplexity rows should read "n/a"."""
    text = str(name_or_path)
    return text in SHAPES or (Path(text) / "RANDOM_WEIGHTS").exists()


def random_model_path(name: str) -> Path:
    """The folder of random model ``name``, built (a few seconds) the first time it is asked for."""
    if name not in SHAPES:
        raise ValueError(f"unknown random model {name!r}: choose one of {', '.join(SHAPES)}")
    folder = cache_dir() / name
    if not (folder / "RANDOM_WEIGHTS").exists():
        build(name, folder)
    return folder


@torch.no_grad()
def build(name: str, folder: Path) -> Path:
    """Write the random model as an HF folder (config, safetensors, the target's tokenizer files),
    atomically. Written here rather than with the loader's ``save_checkpoint``: the loader resolves
    random names through this module, and the import graph stays a tree."""
    import json

    from safetensors.torch import save_file

    from inferlab.model.config import ModelConfig
    from inferlab.folders import atomic_folder
    from inferlab.model import CausalLM

    target = Path(__file__).parents[1] / "assets" / "models" / "target"
    raw = ModelConfig.from_file(target / "config.json").to_hf_dict()  # vocabulary, special tokens, norms, RoPE
    raw.update(SHAPES[name], tie_word_embeddings=True, torch_dtype="float32")
    model = CausalLM(ModelConfig.from_dict(raw))
    gen = torch.Generator().manual_seed(SEED)
    for pname, p in model.named_parameters():
        if p.dim() == 1:  # RMSNorm weights
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    note = NOTE.format(seed=SEED)
    with atomic_folder(folder) as tmp:
        state = {k: v.contiguous() for k, v in model.checkpoint_state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
        for fname in ("tokenizer.json", "tokenizer_config.json"):
            (tmp / fname).write_bytes((target / fname).read_bytes())
        (tmp / "RANDOM_WEIGHTS").write_text(note)
        (tmp / "README.md").write_text(f"# {name}\n\n{note}")
    return folder
