"""Engines over the embedded target and over a tiny transformers-saved random Llama."""
from __future__ import annotations

import pytest

from inferlab.engine.config import EngineConfig
from inferlab.engine.llm_engine import LLMEngine
from inferlab.loader import load_checkpoint


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
