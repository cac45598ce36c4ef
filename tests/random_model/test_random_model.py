"""Named random-weight models: built on first use into the cache, loadable by name, labelled random."""
import torch
from safetensors.torch import load_file

from inferlab.model import random_model
from inferlab.model.config import ModelConfig
from inferlab.llm import LLM
from inferlab.model.loader import ASSETS, load_config
from inferlab.model import CausalLM
from inferlab.sampling import SamplingParams


def test_random_80m_has_the_shape_of_the_issue_table():
    raw = load_config(ASSETS / "target").to_hf_dict()
    raw.update(random_model.SHAPES["random-80m"], tie_word_embeddings=True)
    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_dict(raw))
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size) == (768, 12, 4, 4096)
    assert 78.5e6 < model.num_parameters() < 78.8e6


def test_built_on_first_use_by_name_deterministic_and_labelled(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    monkeypatch.setitem(random_model.SHAPES, "random-tiny", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128))
    assert not (tmp_path / "random-tiny").exists()
    llm = LLM(model="random-tiny", device="cpu")
    folder = tmp_path / "random-tiny"
    assert random_model.is_random_model("random-tiny") and random_model.is_random_model(folder)
    assert not random_model.is_random_model(ASSETS / "target")
    assert "noise" in (folder / "RANDOM_WEIGHTS").read_text()
    out = llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    first = load_file(folder / "model.safetensors")
    random_model.build("random-tiny", tmp_path / "again")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert abs(first["model.layers.0.mlp.up_proj.weight"].std().item() - 0.02) < 0.002
