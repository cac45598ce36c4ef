"""The shipped pair: loads with no network, in inferlab and in transformers, and completes code."""
import json

import pytest
import torch

from inferlab.model.loader import ASSETS, load_checkpoint

from .conftest import run_json


def test_models_json(capsys, shipped):
    listing = run_json(capsys, "models", "--json")
    assert isinstance(listing, list)
    entry = next(m for m in listing if m["name"] == shipped[0])
    assert set(entry) == {"name", "path", "params", "test_ppl", "ppl_protocol", "draft_target_agreement"}
    agreement = json.loads((shipped[1] / "metrics.json").read_text()).get("draft_target_agreement")
    assert entry["draft_target_agreement"] == (agreement if shipped[0].startswith("draft") else None)
    model, _ = load_checkpoint(shipped[0], device="cpu")
    assert entry["params"] == model.num_parameters()
    assert entry["test_ppl"] == json.loads((shipped[1] / "metrics.json").read_text())["test_ppl"] > 1


def test_transformers_loads_the_folder_and_logits_match(shipped):
    transformers = pytest.importorskip("transformers")
    name, folder = shipped
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ours, tok = load_checkpoint(name, device="cpu", dtype=torch.float32)
    ids = torch.tensor([tok.encode("import os\n\n\ndef walk(top):\n    for root, dirs, files in os.walk(top):\n")])
    with torch.no_grad():
        expected, got = ref(ids).logits.float(), ours(ids)
    # both compute in float32 from the same float16 weights: only summation order differs
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


def test_pair_shares_one_tokenizer_and_fits_the_size_budget():
    folders = [ASSETS / n for n in ("target", "draft")]
    if not all((f / "model.safetensors").exists() for f in folders):
        pytest.skip("embedded pair not built")
    assert (folders[0] / "tokenizer.json").read_bytes() == (folders[1] / "tokenizer.json").read_bytes()
    cfgs = [json.loads((f / "config.json").read_text()) for f in folders]
    assert cfgs[0]["vocab_size"] == cfgs[1]["vocab_size"] and cfgs[0]["torch_dtype"] == "float16"
    assert cfgs[0]["num_key_value_heads"] < cfgs[0]["num_attention_heads"]  # GQA
    assert cfgs[0]["max_position_embeddings"] >= 512
    total = sum(p.stat().st_size for f in folders for p in f.iterdir())
    assert total <= 25 * 2**20, f"shipped assets are {total / 2**20:.1f} MB"
    assert "perplexity" in (folders[0] / "README.md").read_text()


def test_target_completes_python():
    if not (ASSETS / "target" / "model.safetensors").exists():
        pytest.skip("embedded target not built")
    from inferlab import LLM, SamplingParams

    llm = LLM(model="target")
    text = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=48))[0].outputs[0].text
    assert len(text.strip()) > 20
    assert text.startswith("\n") and "    " in text  # an indented function body
    assert any(word in text for word in ("return", "if ", "for ", "=", '"""'))
