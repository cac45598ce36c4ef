"""The .gguf file: read back with gguf's own reader, and run by llama.cpp (llama-cpp-python) with the
same perplexity as inferlab computes on the same blocks."""
import math

import numpy as np
import pytest
import torch

from inferlab.eval import ppl as ppl_eval
from inferlab.model.loader import load_checkpoint
from inferlab.quant import quantize_model
from inferlab.quant.gguf_export import rope_permute, write_gguf

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def target():
    return load_checkpoint("target", device="cpu", dtype=torch.float32)


def quantized(target, method):
    import copy
    model = copy.deepcopy(target[0])
    quantize_model(model, method, progress=False)
    return model


def test_f32_export_refuses_a_quantized_model(tmp_path, target):
    from inferlab.errors import InferlabError
    with pytest.raises(InferlabError, match="unquantized"):
        write_gguf(quantized(target, "q8_0"), target[1], tmp_path / "m", "f32")
    assert not (tmp_path / "m").exists()  # nothing half-written


@pytest.mark.parametrize("method", ["q4_k", "q4_1"])
def test_gguf_reader_sees_our_model(tmp_path, target, method):
    model = quantized(target, method)
    path = write_gguf(model, target[1], tmp_path / "m", method)
    reader = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in reader.fields.items()}
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.block_count"].contents() == model.config.num_hidden_layers
    assert fields["llama.attention.head_count_kv"].contents() == model.config.num_key_value_heads
    assert len(fields["tokenizer.ggml.tokens"].contents()) == model.config.vocab_size
    tensors = {t.name: t for t in reader.tensors}
    assert "output.weight" not in tensors  # tied: llama.cpp reuses token_embd
    down = tensors["blk.0.ffn_down.weight"]
    assert down.tensor_type == gguf.GGMLQuantizationType[method.upper()]
    assert fields["general.file_type"].contents() == {"q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_M,
                                                      "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[method]
    ours = model.model.layers[0].mlp.down_proj
    assert np.array_equal(np.asarray(down.data).reshape(ours.qweight.shape), ours.qweight.numpy())
    q = tensors["blk.0.attn_q.weight"]  # rows permuted for llama.cpp's interleaved RoPE
    deq = gguf.quants.dequantize(np.asarray(q.data), q.tensor_type).reshape(256, 256)
    expected = rope_permute(model.model.layers[0].self_attn.q_proj.dequantize(), model.config.num_attention_heads)
    assert np.array_equal(deq, expected.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("method", ["f32", "q8_0", "q4_0", "q4_1", "q4_k"])
def test_llama_cpp_perplexity_matches_ours(tmp_path, target, method):
    pytest.importorskip("llama_cpp")
    from inferlab.quant import llama_cpp_runner
    model = target[0] if method == "f32" else quantized(target, method)
    path = write_gguf(model, target[1], tmp_path / "m", method)
    ids = ppl_eval.test_stream(target[1])[:512]
    ours = ppl_eval.evaluate(model, ids, window=512)["ppl"]
    try:
        theirs = math.exp(llama_cpp_runner.run(path, ids.tolist())["nll"])
    except llama_cpp_runner.LlamaCppError as exc:
        if "SIGILL" in str(exc):
            pytest.skip(str(exc))  # a build for another CPU: an environment problem, said plainly
        raise
    print(f"{method}: llama.cpp {theirs:.4f} vs inferlab {ours:.4f}")
    assert abs(theirs / ours - 1) < (0.002 if method == "f32" else 0.02), f"llama.cpp {theirs:.3f} vs inferlab {ours:.3f}"
