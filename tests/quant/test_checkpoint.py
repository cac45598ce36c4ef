"""Every method: quantize, save, load back (the loader builds the matching linears), same logits;
and a quantized model computes what an fp32 model holding its dequantized weights computes."""
import copy
import json

import pytest
import torch
from torch import nn

from inferlab.model.linear import replace_linears
from inferlab.model.loader import load_checkpoint
from inferlab.quant import QuantLinear, quantize_model, save_quantized
from inferlab.quant.int4 import Int4Linear

from .helpers import tiny_model, tokens

# (method, bits, group, bound on the logits' relative error against the float model). Measured on
# tiny_model: int8 0.011, int4-4-64 0.18, int4-3-128 0.37, gptq-4-128 0.045, gptq-3-64 0.13, awq 0.085, nf4 0.13,
# q8_0 0.0096, q4_0 0.16, q4_1 0.11, q4_k 0.13; each bound is about 1.4x that, so a broken scale or grid fails.
CASES = [("int8", None, None, 0.016), ("int4", 4, 64, 0.25), ("int4", 3, 128, 0.5), ("gptq", 4, 128, 0.065),
         ("gptq", 3, 64, 0.18), ("awq", 4, 128, 0.12), ("nf4", None, None, 0.19), ("q8_0", None, None, 0.014),
         ("q4_0", None, None, 0.23), ("q4_1", None, None, 0.15), ("q4_k", None, None, 0.18)]


@pytest.fixture(autouse=True)
def exact_products(monkeypatch):
    """Logits are compared with a dequantized copy to 1e-5: keep off the VNNI loops, which round
    activations (tests/kernels/test_quant_vnni.py bounds that rounding against the same reference)."""
    monkeypatch.setenv("INFERLAB_QUANT_KERNEL", "compiled")


def dequantized_copy(model):
    """An fp32 model whose linears hold the dequantized weights (in the original column order)."""
    ref = copy.deepcopy(model)

    def to_linear(name, mod):
        lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
        w = mod.dequantize_original_order() if isinstance(mod, Int4Linear) else mod.dequantize()
        lin.weight.data = w.float()
        if mod.bias is not None:
            lin.bias.data = mod.bias.data.float()
        return lin

    for name, mod in list(ref.named_modules()):
        if isinstance(mod, QuantLinear):
            parent, _, child = name.rpartition(".")
            setattr(ref.get_submodule(parent), child, to_linear(name, mod))
    return ref


@pytest.mark.parametrize("method,bits,group,bound", CASES, ids=[f"{m}-{b}-{g}" for m, b, g, _ in CASES])
def test_quantize_save_load_round_trip(tmp_path, method, bits, group, bound):
    model = tiny_model()
    x = tokens(2, 16, seed=1)
    with torch.no_grad():
        fp = model(x)
    qcfg = quantize_model(model, method, bits, group, calibration_tokens=tokens(), progress=False)
    assert all(isinstance(m, QuantLinear) for n, m in model.named_modules()
               if n.endswith("_proj")), "every projection is quantized"
    assert isinstance(model.lm_head, nn.Linear)
    with torch.no_grad():
        ours = model(x)
        ref = dequantized_copy(model)(x)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)  # the forward computes its own weights
    err = ((ours - fp).norm() / fp.norm()).item()  # ... which are close to the float ones
    assert 1e-4 < err < bound, err

    folder = save_quantized(model, None, tmp_path / "q", qcfg)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == method
    loaded, _ = load_checkpoint(folder, device="cpu", dtype=torch.float32)
    assert type(loaded.model.layers[0].mlp.down_proj) is type(model.model.layers[0].mlp.down_proj)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ours, rtol=1e-5, atol=1e-6)  # act-order: same groups, another summation order


def test_gptq_folder_uses_the_hub_layout(tmp_path):
    from safetensors import safe_open
    model = tiny_model()
    qcfg = quantize_model(model, "gptq", 4, 128, calibration_tokens=tokens(), progress=False, act_order=True)
    assert qcfg | {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True} == qcfg
    folder = save_quantized(model, None, tmp_path / "g", qcfg)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        qw, gi = f.get_tensor("model.layers.0.mlp.down_proj.qweight"), f.get_tensor("model.layers.0.mlp.down_proj.g_idx")
    assert {"model.layers.0.self_attn.q_proj.qzeros", "model.layers.0.self_attn.q_proj.scales"} <= keys
    assert qw.dtype == torch.int32 and qw.shape == (512 * 4 // 32, 256)
    assert gi.dtype == torch.int32 and sorted(torch.bincount(gi.long()).tolist()) == [128] * 4
    assert not torch.equal(gi, torch.arange(512, dtype=torch.int32) // 128)  # act-order permuted the columns


def test_llm_quantization_argument_quantizes_at_load():
    """int8 at load: the logits stay within 2% of the float model's (an amax/255 scale gives ~35%),
    and greedy decoding starts with the same tokens."""
    from inferlab.llm import LLM
    from inferlab.quant import Int8Linear
    from inferlab.sampling import SamplingParams
    llm = LLM(model="target", quantization="int8", device="cpu")
    ref = LLM(model="target", device="cpu")
    assert isinstance(llm.model.model.layers[0].self_attn.q_proj, Int8Linear)
    assert llm.quantization_config == {"quant_method": "int8", "bits": 8}
    x = torch.tensor([llm.tokenizer.encode("def fib(n):\n    if n < 2:\n        return n\n")])
    with torch.no_grad():
        q, fp = llm.model(x), ref.model(x)
    assert ((q - fp).norm() / fp.norm()).item() < 0.02
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ours, theirs = (m.generate("def fib(n):", params)[0].outputs[0].token_ids for m in (llm, ref))
    assert ours[:4] == theirs[:4] and len(ours) == 8


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_qwen2_with_attention_bias_in_hub_layout(tmp_path, method):
    """Qwen2 checkpoints carry q/k/v biases next to the packed tensors; symmetric v1 GPTQ (AutoGPTQ's default).
    The loaded folder computes what the in-memory model does, and both stay near the float model."""
    model = tiny_model(model_type="qwen2", architectures=["Qwen2ForCausalLM"], attention_bias=True)
    x = tokens(2, 8, seed=3)
    with torch.no_grad():
        fp = model(x)
    extra = {"sym": True, "act_order": False} if method == "gptq" else {}
    qcfg = quantize_model(model, method, 4, 128, calibration_tokens=tokens(), progress=False, **extra)
    if method == "gptq":
        assert qcfg["checkpoint_format"] == "gptq" and qcfg["sym"] and not qcfg["desc_act"]
    folder = save_quantized(model, None, tmp_path / "q", qcfg)
    loaded, _ = load_checkpoint(folder, device="cpu", dtype=torch.float32)
    assert loaded.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():
        ours = loaded(x)
        torch.testing.assert_close(ours, model(x), rtol=1e-5, atol=1e-6)
    bound = {"gptq": 0.085, "awq": 0.16}[method]  # measured 0.062 (gptq, symmetric) and 0.118 (awq)
    assert ((ours - fp).norm() / fp.norm()).item() < bound
