"""Engines over the embedded target and over a tiny transformers-saved random Llama."""
from __future__ import annotations

import pytest
import torch

from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.model.loader import load_checkpoint


@pytest.fixture(scope="session")
def target():
    return load_checkpoint("target", device="cpu")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    from core.checkpoints import save_variant

    folder = tmp_path_factory.mktemp("tiny_gqa")
    save_variant("llama_gqa", folder)
    return load_checkpoint(folder, device="cpu")


def make_engine(pair, **knobs) -> LLMEngine:
    model, tokenizer = pair
    return LLMEngine(model, tokenizer, EngineConfig(**knobs))


def run_all(engine: LLMEngine) -> dict:
    """Step until done; request id -> final RequestOutput."""
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


def same_greedy(model, prompt, got, want, tol: float = 1e-4) -> bool:
    """``got`` equals the reference's greedy ``want``, or first departs from it where the reference's
    logits for the two tokens are within ``tol``: a float near-tie that another summation order (a
    batched paged forward against a solo contiguous one) may flip. Everything after it is free."""
    if got == want:
        return True
    j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if j is None:  # one is a strict prefix of the other: a length bug, not a tie
        return False
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + list(want[:j])], device=model.device), last_only=True)[0, -1]
    return abs(float(logits[want[j]]) - float(logits[got[j]])) < tol



@pytest.fixture(scope="session")
def eagle_config(toy_eagle_folder):
    return {"method": "eagle", "num_speculative_tokens": 3, "model": str(toy_eagle_folder)}
