"""Widths the method's group does not divide (SmolLM2: 576 = 4.5 x 128): each such tensor gets its
own format, recorded per tensor in quantization_config["modules"], and the folder loads back to
the same modules and logits. The quantized head: Q8_0 or INT8, saved and loaded, fewer bytes."""
import json

import pytest
import torch
from torch import nn

from inferlab.model.loader import load_checkpoint
from inferlab.quant import QuantizationError, QuantLinear, quantize_model, save_quantized
from inferlab.quant.ggml import GGMLLinear
from inferlab.quant.int4 import Int4Linear
from inferlab.quant.int8 import Int8Linear
from inferlab.quant.methods import tensor_format

from .helpers import tiny_model, tokens

# hidden 192 = 3 x 64: a multiple of 32 and 64, not of 128 or 256; the FFN's 512 is a multiple of both
NARROW = dict(hidden_size=192, num_attention_heads=3, num_key_value_heads=1, head_dim=64)
WIDE_INPUT = "mlp.down_proj"  # the only projection whose input is 512 wide


@pytest.fixture(autouse=True)
def exact_products(monkeypatch):
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "compiled")


@pytest.mark.parametrize("width,group,expected", [
    (576, 128, {"group_size": 64}), (1536, 128, {}), (576, 64, {}), (192, 128, {"group_size": 64}),
    (96, 128, {"group_size": 32}), (576, -1, {}), (576, None, {}),
])
def test_int4_groups_halve_until_they_divide_the_width(width, group, expected):
    assert tensor_format("int4", group, width) == expected
    assert tensor_format("gptq", group, width) == expected


def test_q4_k_falls_back_to_q4_1_and_nf4_counts_the_whole_weight():
    assert tensor_format("q4_k", 256, 576) == {"quant_method": "q4_1"}
    assert tensor_format("q4_k", 256, 1536) == {}
    assert tensor_format("q8_0", 32, 576) == {}
    assert tensor_format("nf4", 64, 576, 192) == {}


@pytest.mark.parametrize("method,group,width,message", [
    ("int4", 96, 256, "group size 96 does not divide the input dimension 256"),
    ("int4", 128, 48, "nor does any half of it down to 32"),
    ("q8_0", 32, 48, "q8_0 blocks hold 32 values, which does not divide the input dimension 48"),
    ("q4_k", 256, 48, "q4_k blocks hold 256 values"),
    ("nf4", 64, 9, "nf4 block size 64 does not divide the 1 x 9 weight"),
])
def test_widths_nothing_fits_are_one_line_errors(method, group, width, message):
    with pytest.raises(QuantizationError, match=message) as info:
        tensor_format(method, group, width)
    assert "\n" not in str(info.value)


def expected_modules(method: str) -> dict:
    if method in ("int4", "gptq", "awq"):
        return {"group_size": 64}
    if method == "q4_k":
        return {"quant_method": "q4_1"}
    return {}


@pytest.mark.parametrize("method", ["int4", "gptq", "awq", "nf4", "q4_0", "q4_k", "q8_0"])
def test_every_method_quantizes_a_narrow_model_and_loads_it_back(tmp_path, method):
    model = tiny_model(**NARROW)
    x = tokens(2, 16, seed=1)
    with torch.no_grad():
        fp = model(x)
    qcfg = quantize_model(model, method, calibration_tokens=tokens(), progress=False)
    projections = {n: m for n, m in model.named_modules() if n.endswith("_proj")}
    assert all(isinstance(m, QuantLinear) for m in projections.values())
    want = expected_modules(method)
    assert qcfg.get("modules", {}) == {n: want for n in projections if not n.endswith(WIDE_INPUT) and want}
    for name, mod in projections.items():
        if method == "q4_k":
            assert mod.ggml_type == ("q4_k" if name.endswith(WIDE_INPUT) else "q4_1"), name
        if isinstance(mod, Int4Linear):
            assert mod.group_size == (128 if name.endswith(WIDE_INPUT) else 64), name
    with torch.no_grad():
        q = model(x)
    rel = ((q - fp).norm() / fp.norm()).item()
    assert rel < 0.3, f"{method}: logits {rel:.3f} away from the float model's"  # measured 0.02-0.20
    folder = save_quantized(model, None, tmp_path / method, qcfg)
    assert json.loads((folder / "config.json").read_text())["quantization_config"] == qcfg
    loaded, _ = load_checkpoint(folder, device="cpu", dtype=torch.float32)
    for name, mod in loaded.named_modules():
        if name in projections:
            assert type(mod) is type(projections[name]) and getattr(mod, "group_size", None) == \
                getattr(projections[name], "group_size", None) and getattr(mod, "ggml_type", None) == \
                getattr(projections[name], "ggml_type", None), name
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), q, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method,head_type", [("int4", Int8Linear), ("q4_k", GGMLLinear), ("int8", Int8Linear)])
def test_the_head_quantized_saves_bytes_and_loads_back(tmp_path, method, head_type):
    model = tiny_model(**NARROW, vocab_size=4096)
    x = tokens(2, 16, seed=1)
    with torch.no_grad():
        fp = model(x)
    qcfg = quantize_model(model, method, quantize_head=True, progress=False)
    assert isinstance(model.lm_head, head_type) and isinstance(model.model.embed_tokens.weight, nn.Parameter)
    assert qcfg["modules"]["lm_head"] == {"quant_method": "q8_0" if method == "q4_k" else "int8"}
    head_bytes = model.lm_head.weight_bytes()
    assert head_bytes < 0.3 * 4096 * 192 * 4  # 8.5 bits (Q8_0) or 8 + a scale per row, against 32
    with torch.no_grad():
        q = model(x)
    assert ((q - fp).norm() / fp.norm()).item() < 0.3
    folder = save_quantized(model, None, tmp_path / method, qcfg)
    loaded, _ = load_checkpoint(folder, device="cpu", dtype=torch.float32)
    assert isinstance(loaded.lm_head, head_type)
    assert loaded.lm_head.weight_bytes() == head_bytes
    torch.testing.assert_close(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), q, rtol=1e-5, atol=1e-5)


def test_gguf_export_writes_each_tensor_in_its_own_type_and_the_head_as_q8_0(tmp_path):
    gguf = pytest.importorskip("gguf")
    from inferlab.quant.gguf_export import write_gguf

    tok = load_checkpoint("draft", device="cpu", dtype=torch.float32)[1]  # a byte-level BPE to write
    model = tiny_model(**NARROW, vocab_size=tok.hf.get_vocab_size())
    quantize_model(model, "q4_k", quantize_head=True, progress=False)
    path = write_gguf(model, tok, tmp_path / "m", "q4_k")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["token_embd.weight"] == "Q8_0"
    assert types["blk.0.ffn_down.weight"] == "Q4_K"
    assert {types[f"blk.{i}.{n}.weight"] for i in range(2)
            for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")} == {"Q4_1"}
    loaded, _ = load_checkpoint(path, device="cpu", dtype=torch.float32)  # the GGUF as stored
    assert isinstance(loaded.lm_head, GGMLLinear) and loaded.lm_head.ggml_type == "q8_0"
    assert torch.equal(loaded.lm_head.qweight, model.lm_head.qweight)
    torch.testing.assert_close(loaded.model.embed_tokens.weight, model.lm_head.dequantize())  # one tensor
    model.model.embed_tokens.weight.data = model.lm_head.dequantize()  # the lookup reads those codes too
    x = tokens(1, 8, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-4, atol=1e-4)
