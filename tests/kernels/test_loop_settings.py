"""The loop settings (inferlab.loop_settings.settings): a model's forward reads the environment once and
keeps that reading for the whole pass; outside a forward every call sees the environment as it is."""
import pytest
import torch

from inferlab import loop_settings
from inferlab.model.config import ModelConfig
from inferlab.model.llama import CausalLM


def _model(layers=3):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    return CausalLM(cfg).eval()


def test_outside_a_forward_the_environment_is_read_at_each_call(monkeypatch):
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "Eager")
    assert loop_settings.settings().kernel == "eager"
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "auto")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    monkeypatch.setenv("INFERLAB_VNNI_BUILD", "portable")
    assert loop_settings.settings() == loop_settings.Settings("auto", "avx2", "portable")


def test_a_forward_reads_the_environment_once(monkeypatch):
    reads = []
    real = loop_settings._read
    monkeypatch.setattr(loop_settings, "_read", lambda: reads.append(1) or real())
    model = _model()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
        assert len(reads) == 1  # not once per projection, norm and attention call
        model(torch.tensor([[4]]))
    assert len(reads) == 2
    assert loop_settings._held is None  # released after the pass


def test_a_setting_changed_during_a_forward_holds_from_the_next_one(monkeypatch):
    model = _model()
    seen = []
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "auto")

    def first(*_):
        monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "eager")
        seen.append(loop_settings.settings().kernel)
    model.model.layers[0].register_forward_hook(first)
    model.model.layers[-1].register_forward_hook(lambda *_: seen.append(loop_settings.settings().kernel))
    with torch.no_grad():
        model(torch.tensor([[1, 2]]))
    assert seen == ["auto", "auto"]  # the whole pass keeps its first reading
    assert loop_settings.settings().kernel == "eager"  # the next call sees the change


def test_held_nests_and_is_released_by_an_error(monkeypatch):
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "auto")
    with pytest.raises(RuntimeError):
        with loop_settings.held():
            monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "compiled")
            with loop_settings.held():  # a draft's forward inside its target's step keeps the outer reading
                assert loop_settings.settings().kernel == "auto"
            assert loop_settings.settings().kernel == "auto"
            raise RuntimeError("a forward that fails")
    assert loop_settings._held is None
    assert loop_settings.settings().kernel == "compiled"
