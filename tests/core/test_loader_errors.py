"""Every bad checkpoint gets one clear line that says what to do."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferlab.errors import CheckpointError
from inferlab.model.loader import load_checkpoint, save_checkpoint

from .checkpoints import save_variant


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    save_variant("llama_gqa", folder)
    return folder


def copy(good, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(good, dst)
    return dst


def expect_error(path, *fragments):
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, device="cpu")
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_folder(tmp_path):
    expect_error(tmp_path / "nope", "not found", "config.json")


def test_missing_config(good, tmp_path):
    folder = copy(good, tmp_path)
    (folder / "config.json").unlink()
    expect_error(folder, "no config.json")


def test_unsupported_architecture_names_the_supported_ones(good, tmp_path):
    folder = copy(good, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    expect_error(folder, "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def test_missing_weights_are_named(good, tmp_path):
    folder = copy(good, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    expect_error(folder, "missing 1", "model.layers.1.mlp.up_proj.weight")


def test_unexpected_weights_are_named(good, tmp_path):
    folder = copy(good, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.extra.weight"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors")
    expect_error(folder, "unexpected 1", "model.layers.0.extra.weight")


def test_pickle_weights_are_refused_with_a_conversion_hint(good, tmp_path):
    folder = copy(good, tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    expect_error(folder, "refusing pickle", "pytorch_model.bin", "safetensors")


def test_hub_id_without_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expect_error("some-org/some-model-that-is-not-cached", "cannot download", "--local-dir")


def test_sharded_index_loads(good, tmp_path):
    folder = copy(good, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / file)
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    model, tokenizer = load_checkpoint(folder, device="cpu")
    assert tokenizer is None
    ref, _ = load_checkpoint(good, device="cpu")
    ids = torch.arange(10)[None]
    assert torch.equal(model(ids), ref(ids))


def test_save_round_trip_and_transformers_reads_it(good, tmp_path):
    import transformers

    model, _ = load_checkpoint(good, device="cpu")
    out = save_checkpoint(model, None, tmp_path / "saved")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left
    again, _ = load_checkpoint(out, device="cpu")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.arange(12)[None]
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
        assert (hf(ids).logits - model(ids)).abs().max() <= 1e-4
